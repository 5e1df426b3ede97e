"""How long ``oomptimize --plan`` takes on this machine's CPU: per reference model, a plan of 30 2D buckets
(durations to 40 s, two token bounds each: ``workbench.oomptimizer.synthetic.demo_buckets``) for one GPU's
memory, as the CLI runs it (in ``plan_workers()`` forked processes): wall seconds, traced steps and traced
steps per bucket; ``--repeat`` plans per model give the median and its spread (a shared host's speed varies).
The target: every plan at most 2 minutes on the 2-core CPU machine.

    python -m benchmarks.plan_calibration.speed [--models large-rnnt xl-aed] [--gpu-memory h200] [--repeat 3] [--out DIR]
    python -m benchmarks.plan_calibration.speed --smoke --out /tmp/x    # tiny-rnnt, 4 buckets
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.plan_calibration import start_cpu_plan_run
from workbench.bucketing import BucketProfile
from workbench.oomptimizer.plan import build_fake_reference_model, new_fake_mode, plan_profile, plan_workers
from workbench.oomptimizer.synthetic import demo_buckets
from workbench.options import positive_int
from workbench.timing import summarize

NAME = "plan_speed"
TARGET_S = 120.0  # the slowest of the timed plans must be within it
REPEAT, SMOKE_REPEAT = 3, 2  # plans timed per model


def plan_seconds(name: str, buckets: list, gpu_memory: str, repeat: int = 1) -> dict:
    """``repeat`` plans of ``buckets`` for ``gpu_memory``, each from a fresh fake model as the CLI makes one:
    the median seconds (the model's fake build included) with their spread, and the traced steps."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fake_mode = new_fake_mode()
        model = build_fake_reference_model(name, fake_mode)
        _, result = plan_profile(model, fake_mode, name, BucketProfile([list(b) for b in buckets]),
                                 gpu_memory=gpu_memory, merge=False, workers=plan_workers())  # as the CLI plans
        samples.append(time.perf_counter() - t0)
        print(f"{name}: {len(buckets)} buckets planned in {samples[-1]:.1f} s, {result.num_probes} traced steps",
              flush=True)
    spread = summarize(samples)
    return {"seconds": spread["median"], "seconds_spread": spread, "traced_steps": result.num_probes,
            "traced_steps_per_bucket": result.probes_per_bucket, "target_s": TARGET_S}


def add_repeat(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=positive_int, default=None,
                        help=f"plans per model, timed one after another (default {REPEAT}; {SMOKE_REPEAT} with --smoke)")


def main(argv=None) -> int:
    run = start_cpu_plan_run(argv, __doc__, "python -m benchmarks.plan_calibration.speed", name=NAME,
                             what="oomptimize --plan's wall time on this machine's CPU: 30 2D buckets per model",
                             default_models="large-rnnt xl-aed; --smoke: tiny-rnnt", add_options=add_repeat)
    args = run.args
    repeat = args.repeat or (SMOKE_REPEAT if args.smoke else REPEAT)
    models = args.models or (["tiny-rnnt"] if args.smoke else ["large-rnnt", "xl-aed"])
    buckets = demo_buckets(num_durations=2, max_duration=4.0) if args.smoke else demo_buckets()
    run.params = {"models": models, "buckets": [list(b) for b in buckets], "gpu_memory": args.gpu_memory,
                  "cpu_count": os.cpu_count(), "target_s": TARGET_S, "repeat": repeat}
    run.figures["models"] = {}
    for name in models:
        if run.wants(name):
            with run.part(name):
                run.figures["models"][name] = plan_seconds(name, buckets, args.gpu_memory, repeat)
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
