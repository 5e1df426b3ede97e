"""What the fused joint + loss buys the OOMptimizer, planned on the CPU: per transducer, the planned batch
size of every bucket with the joint's logits materialized and with the joint and loss fused (``oomptimize
--plan --loss materialized|fused`` for one GPU's memory), their ratio, and the predicted peak of one
training step at a fixed shape with each. Planned, not measured: the plan's calibration against the H200 is
plan_calibration.json.

    python -m benchmarks.plan_calibration.joint_loss [--models large-rnnt large-tdt] [--gpu-memory h200] [--out DIR]
    python -m benchmarks.plan_calibration.joint_loss --smoke --out /tmp/x    # tiny models, two small buckets
"""

from __future__ import annotations

import time

from benchmarks.byo_models.run import bench_buckets
from benchmarks.harness import Run
from benchmarks.plan_calibration import start_cpu_plan_run
from workbench.bucketing import BucketProfile
from workbench.oomptimizer.plan import StepTracer, build_fake_reference_model, new_fake_mode, plan_profile

NAME = "plan_joint_loss"
JOINT_LOSSES = ("materialized", "fused")
STEP_SHAPE = ((15.0, 120), 64)  # (duration s, tokens), batch size: the losses bench's training step
SMOKE_STEP_SHAPE = ((2.0, 12), 8)


def plan_model(name: str, buckets: list, args) -> dict:
    """Planned sizes per bucket and the step's predicted peak (bytes), per joint_loss, and fused / materialized."""
    entry = {}
    for joint_loss in JOINT_LOSSES:
        fake_mode = new_fake_mode()
        model = build_fake_reference_model(name, fake_mode, joint_loss=joint_loss)
        t0 = time.perf_counter()
        profile, _ = plan_profile(model, fake_mode, name, BucketProfile([list(b) for b in buckets]),
                                  gpu_memory=args.gpu_memory, memory_fraction=args.memory_fraction,
                                  rel_gap=args.rel_gap, merge=False)
        shape, batch_size = SMOKE_STEP_SHAPE if args.smoke else STEP_SHAPE
        peak = StepTracer(model, fake_mode).trace(shape, batch_size).peak_allocated_bytes
        entry[joint_loss] = {"sizes": profile.bucket_batch_size, "step_peak_bytes": peak,
                             "seconds": time.perf_counter() - t0}
        print(f"{name} {joint_loss}: sizes {profile.bucket_batch_size}, step peak {peak / 2**30:.2f} GiB", flush=True)
    sizes = zip(entry["fused"]["sizes"], entry["materialized"]["sizes"])
    entry["size_ratio"] = [fused / materialized if materialized else None for fused, materialized in sizes]
    entry["step_peak_ratio"] = entry["fused"]["step_peak_bytes"] / entry["materialized"]["step_peak_bytes"]
    return entry


def start_run(argv=None) -> Run:
    """The options parsed and checked (no GPU needed)."""
    return start_cpu_plan_run(argv, __doc__, "python -m benchmarks.plan_calibration.joint_loss", name=NAME,
                              what="Planned batch sizes per bucket and step peaks with the joint's logits materialized "
                                   "and with the joint and loss fused (CPU plan, not a measurement)",
                              default_models="large-rnnt large-tdt; --smoke: tiny-rnnt", search_options=True)


def main(argv=None) -> int:
    run = start_run(argv)
    args = run.args
    models = args.models or (["tiny-rnnt"] if args.smoke else ["large-rnnt", "large-tdt"])
    buckets = bench_buckets(args)
    shape, batch_size = SMOKE_STEP_SHAPE if args.smoke else STEP_SHAPE
    run.params = {"models": models, "buckets": buckets, "gpu_memory": args.gpu_memory,
                  "memory_fraction": args.memory_fraction, "step": {"bucket": list(shape), "batch_size": batch_size}}
    run.figures["models"] = {}
    for name in models:
        if run.wants(name):
            with run.part(name):
                run.figures["models"][name] = plan_model(name, buckets, args)
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
