"""The plan against the GPU (``run``), replayed on the CPU (``replay``), with the fused joint + loss
(``joint_loss``) and its speed on the CPU (``speed``)."""

from __future__ import annotations


def start_cpu_plan_run(argv, doc: str, prog: str, *, name: str, what: str, default_models: str,
                       search_options: bool = False, add_options=None):
    """A CPU bench's Run over plans: the harness's options, ``--models`` (its help names ``default_models``),
    ``--gpu-memory`` (a name or a size, default h200; a bad one is the parser's one-line error), if asked the
    search's options, and those ``add_options(parser)`` adds."""
    from benchmarks.byo_models.run import add_search_options
    from benchmarks.harness import bench_parser, start
    from workbench.oomptimizer.plan import gpu_memory_bytes

    parser = bench_parser(doc)
    parser.prog = prog
    parser.add_argument("--models", nargs="+", help=f"reference models (default: {default_models})")
    parser.add_argument("--gpu-memory", default="h200", help="the GPU planned for: a name or a size (default h200)")
    if search_options:
        add_search_options(parser)
    if add_options is not None:
        add_options(parser)
    run = start(parser, argv, name=name, needs_cuda=False, what=what)
    try:
        gpu_memory_bytes(run.args.gpu_memory)
    except ValueError as e:
        parser.error(str(e))
    return run
