"""The allocator bench's CLI: expandable segments vs the plain caching allocator with dynamic batch shapes
near the memory limit (the protocol: benchmarks/NOTES.md, "How each bench measures").

    python3 -m benchmarks.allocator --out benchmarks/results            # GPU
    python3 -m benchmarks.allocator --out DIR --headroom 0.08 0.15       # a headroom sweep
    python3 -m benchmarks.allocator --smoke --out /tmp/smoke            # CPU dry run, seconds

Steps: parse the options, draw the batch shapes from lhotse's sampler (``shapes.py``), calibrate each
shape's peak in a worker subprocess (``worker.py``), run rounds of worker subprocesses while the budget
allows (``rounds.py``), and write ``<out>/<name>.json`` after every round (``figures.py``; the fields:
``workbench/records/allocator.py``). Exit code 1 when a target is missed outside --smoke, 2 without CUDA
and without --smoke.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.allocator import rounds as rounds_
from benchmarks.allocator.figures import write_record
from benchmarks.allocator.shapes import write_shapes_only
from benchmarks.allocator.worker import parse_blocks
from benchmarks.harness import Run, bench_parser, cuda_missing, start
from workbench.records import allocator as record

BLOCKS = "PEEP"  # one round: P plain allocator, E expandable segments; ABBA cancels a linear drift
SMOKE_DEFAULTS = dict(model="tiny-rnnt", steps=4, batch_audio_s=6.0, buckets=2, worker_timeout_s=120, rounds=1,
                      budget_s=120.0)


def make_parser():
    """The harness's options (--out --smoke --budget-s) and the bench's own."""
    p = bench_parser(__doc__, budget_s=500.0)
    p.add_argument("--steps", type=int, default=64, help="batch shapes in the sequence (a warm-up pass over them, "
                   "then --passes measured passes)")
    p.add_argument("--passes", type=int, default=1, help="measured passes over the shapes per block (each shape "
                   "twice in a row)")
    p.add_argument("--blocks", default=BLOCKS, help="allocator per block of a round, P plain, E expandable segments; "
                   "needs as many P as E")
    p.add_argument("--rounds", type=int, default=4, help="most rounds (each: every headroom, one fresh subprocess "
                   "running --blocks); rounds after the first run only while --budget-s allows (a round starts only "
                   "when it is expected to end within it)")
    p.add_argument("--shapes-file", help="JSON list of [batch_size, duration_s, num_tokens] written by --write-shapes")
    p.add_argument("--write-shapes", help="only write the sampler's shapes to this JSON file and exit (CPU)")
    p.add_argument("--model", default="large-rnnt")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--batch-audio-s", type=float, default=200.0, help="padded audio seconds per batch")
    p.add_argument("--buckets", type=int, default=8)
    p.add_argument("--headroom", type=float, nargs="+", default=[0.08],
                   help="memory limit = (1 + this) x largest peak; several values: a sweep, one block each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="allocator", help="result name: <out>/<name>.json")
    p.add_argument("--worker-timeout-s", type=int, default=480, help="limit of one worker subprocess (a whole "
                   "round), seconds")
    return p


def check_options(parser, args) -> None:
    """--smoke's defaults where the command line kept the default, and the workers' device; ValueError for a
    bad value."""
    if args.smoke:
        for name, value in SMOKE_DEFAULTS.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2, got {args.steps}")
    if args.passes < 1 or args.rounds < 1:
        raise ValueError(f"--passes and --rounds must be >= 1, got {args.passes} and {args.rounds}")
    blocks = parse_blocks(args.blocks)
    if sum(blocks) * 2 != len(blocks):
        raise ValueError(f"--blocks: want as many P as E blocks (the configurations are compared per pass), "
                         f"got {args.blocks!r}")
    if any(h < 0 for h in args.headroom) or len(set(args.headroom)) != len(args.headroom):
        raise ValueError(f"--headroom: want distinct values >= 0, got {args.headroom}")
    args.device = "cpu" if args.smoke and not torch.cuda.is_available() else "cuda"


def run_rounds(run: Run, rounds: rounds_.Rounds, tmp: Path, shapes_path: Path) -> None:
    """Rounds while --rounds and --budget-s allow (the first always); the record is rewritten after each, so
    a run killed later keeps the rounds so far. A failed round stops the run and is listed in failures."""
    for r in range(run.args.rounds):
        if not rounds_.next_round_fits(rounds, run.seconds(), run.args.budget_s):
            return
        failed_before = len(run.failures)
        with run.part(f"round {r + 1}"):
            rounds_.run_round(rounds, r, tmp, shapes_path, run.args)
            write_record(run, rounds, complete=False)
        if len(run.failures) > failed_before:
            print(f"[allocator] round {r + 1} failed; keeping the complete rounds", flush=True)
            return


def main(argv=None) -> int:
    parser = make_parser()
    run = start(parser, argv, name="", what="allocator", needs_cuda=False)  # write_record writes the record
    args = run.args
    check_options(parser, args)
    if args.write_shapes:
        return write_shapes_only(args)
    if cuda_missing(args.smoke):
        return 2
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shapes_path = tmp / "shapes.json"
        rounds = rounds_.calibrate(args, tmp, shapes_path)
        run_rounds(run, rounds, tmp, shapes_path)
    path, figures, params = write_record(run, rounds, complete=True)
    print(f"\nwrote {path}")
    print("\n".join(record.table_lines({"figures": figures, "params": params})))
    run.failures[:] = figures["failures"]  # the failed parts and every headroom's checks
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
