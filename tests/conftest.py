import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.reporting import has_cuda as _has_cuda


def pytest_configure(config):
    """Each xdist worker takes its share of the cores for torch's threads (`make test` runs two workers on
    machines of two cores): workers that each take every core oversubscribe them, and run slower."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        share = max(1, cores // workers)
        torch.set_num_threads(share)
        # the processes the tests start (CLI runs, torchrun ranks, the compile check) take the same share:
        # OpenMP's threads and inductor's pool of compile workers, one per core each, would oversubscribe them
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(share))


def pytest_collection_finish(session):
    """Move what collection imported (torch, numpy, the workbench modules: millions of objects) to the permanent
    generation: the cyclic collector's full collections during the tests stop scanning it again each time."""
    gc.collect()
    gc.freeze()


# The longest tests on a 2-core CPU machine (each 10-50 s: compiles, torchrun, CLI runs, interpreted kernels),
# longest first. xdist's worksteal gives each of `-n 2` workers one contiguous half of the tests and lets an
# idle worker take from the end of the other's queue: each half starts with every other long test, so both
# workers begin with long tests and neither is left finishing one alone.
LONGEST_FIRST = (
    "tests/models/test_lean_step.py::test_compiled_encoder_gives_the_eager_loss_and_gradients_on_new_shapes",
    "tests/models/test_train_ddp.py::test_two_ranks_resume_each_where_its_sampler_stood",
    "tests/models/test_train_ddp.py::test_two_ranks_draw_disjoint_batches_and_end_with_identical_weights",
    "tests/benchmarks/test_bench_smoke.py::test_oomptimizer_bench_smoke_ddp_two_processes",
    "tests/benchmarks/test_bench_smoke.py::test_oomptimizer_bench_smoke",
    "tests/benchmarks/test_flow.py::test_flow_on_cpu_runs_the_commands_checks_and_writes_the_record",
    "tests/decoding/test_fused.py::test_a_joint_whose_declaration_does_not_hold_runs_its_own_joint",
    "tests/benchmarks/test_bench_smoke.py::test_allocator_bench_smoke",
    "tests/benchmarks/test_bench_smoke.py::test_oomptimizer_bench_parts_write_their_own_files",
    "tests/decoding/test_fused.py::test_fused_decoder_gives_the_torch_hypotheses",
    "tests/benchmarks/test_bench_smoke.py::test_decoding_bench_smoke",
    "tests/test_readme.py::test_shell_block_runs",
    "tests/decoding/test_fused.py::test_a_replaced_output_layer_or_a_mode_switch_is_checked_again",
)


def _write_test_time(nodeid: str, phase: str, seconds: float, outcome: str) -> None:
    path = os.environ.get("WORKBENCH_TEST_TIMES")
    if path and "PYTEST_XDIST_WORKER" not in os.environ:  # under xdist the controller writes what workers report
        with open(path, "a") as f:
            f.write(f"{nodeid}\t{phase}\t{seconds:.3f}\t{outcome}\n")


def pytest_runtest_logstart(nodeid, location):
    """With WORKBENCH_TEST_TIMES=FILE, a "<node id>\\tstart\\t0\\t-" line as each test starts, then one per phase
    (setup, call, teardown) as it ends with its seconds and outcome: a stage killed at its limit still leaves the
    times of what ran, and the test it stopped in (python3 -m benchmarks.gpu_test_times reads them)."""
    _write_test_time(nodeid, "start", 0.0, "-")


def pytest_runtest_logreport(report):
    _write_test_time(report.nodeid, report.when, report.duration, report.outcome)


def _longest_first_rank(item) -> int:
    nodeid = item.nodeid.split("[")[0]
    return LONGEST_FIRST.index(nodeid) if nodeid in LONGEST_FIRST else len(LONGEST_FIRST)


def longest_at_the_head_of_each_half(items: list) -> list:
    """The LONGEST_FIRST tests, alternately at the head of the first and of the second half of ``items``;
    the others keep their order."""
    long = sorted((i for i in items if _longest_first_rank(i) < len(LONGEST_FIRST)), key=_longest_first_rank)
    rest = [i for i in items if _longest_first_rank(i) == len(LONGEST_FIRST)]
    first, second = long[0::2], long[1::2]
    split = max(len(items) // 2 - len(first), 0)
    return [*first, *rest[:split], *second, *rest[split:]]


def pytest_collection_modifyitems(config, items):
    items[:] = longest_at_the_head_of_each_half(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leaked_sync_debug_mode(request):
    """A GPU test that fails while torch.cuda.set_sync_debug_mode("error") is on must not fail every test
    after it: reset the mode after each GPU test."""
    yield
    if "gpu" in request.keywords and _has_cuda():
        import torch

        torch.cuda.set_sync_debug_mode(0)


@pytest.fixture
def compile_without_interpreter():
    """Run a Python script (source text) in a fresh process without TRITON_INTERPRET, the repo on its path;
    returns its stdout, after asserting it exited 0 (the tail of its stderr in the message)."""
    def run(script: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout
    return run


@pytest.fixture
def two_threads():
    """Two torch threads during the test, the worker's count put back after: the smoke mains run on one thread,
    and a check that they put the count back needs another count to start from (a worker may have one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
