"""GPU benchmark of the reference models: training-step time and peak memory, plus the RNN-T loss check.

    python3 -m workbench.bench.models --out benchmarks/results

Measures, on one GPU, for large-rnnt, large-tdt, large-aed and xl-aed at three worst-case bucket shapes
(batch x seconds x tokens) in bf16 autocast and fp32: the median of 3 training steps (forward + loss +
backward, after 1 warm-up; gradients zeroed between steps, no optimizer step) and the peak allocated
memory. Ratios compare bf16 with fp32 on the same model and shape. Then it checks our pure-PyTorch RNN-T
loss against torchaudio.functional.rnnt_loss (loss and gradients on the same logits) and times both.
Writes <out>/models.json; takes about 2-3 minutes on an H200. Exits non-zero when a loss is not finite,
the torchaudio comparison disagrees, or a step fails for any reason other than running out of memory.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

from workbench.bench.results import time_cuda, write_result
from workbench.models import build_model, count_parameters, rnnt_loss

MODELS = ["large-rnnt", "large-tdt", "large-aed", "xl-aed"]
SHAPES = [(32, 5.0, 40), (16, 15.0, 120), (8, 30.0, 240)]  # (batch, seconds, tokens): worst case of a bucket
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def measure_model(name: str, shapes, failures: list[str]) -> tuple[int, list[dict]]:
    model = None
    with torch.device("cuda"):
        model = build_model(name)
    params = count_parameters(model)
    rows = []
    for batch_size, seconds, tokens in shapes:
        batch = model.make_batch(batch_size, seconds, tokens, "cuda")
        for dtype_name, dtype in DTYPES.items():
            row = {"model": name, "batch_size": batch_size, "duration_s": seconds, "num_tokens": tokens,
                   "dtype": dtype_name}
            losses = []

            def step():
                model.zero_grad(set_to_none=True)
                losses.append(model.training_step(batch, dtype=dtype))

            try:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                row["step_s"] = time_cuda(step, repeat=3, warmup=1)
                row["peak_bytes"] = torch.cuda.max_memory_allocated()
                row["loss"] = float(losses[-1])
                row["audio_s_per_s"] = batch_size * seconds / row["step_s"]["median"]
                if not all(torch.isfinite(x).item() for x in losses):
                    failures.append(f"{name} {dtype_name} B={batch_size} {seconds}s: loss not finite {losses}")
            except torch.OutOfMemoryError:
                row["oom"] = True
            model.zero_grad(set_to_none=True)
            losses.clear()
            gc.collect()
            torch.cuda.empty_cache()
            rows.append(row)
            print(f"  {name} {dtype_name} B={batch_size} {seconds:g}s U={tokens}: "
                  f"{row.get('step_s', {}).get('median', float('nan')) * 1e3:.1f} ms, "
                  f"{row.get('peak_bytes', 0) / 2**30:.1f} GiB{' OOM' if row.get('oom') else ''}", flush=True)
        del batch
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return params, rows


def torchaudio_check(failures: list[str]) -> dict:
    """Our rnnt_loss vs torchaudio's on the same random logits: values, gradients, time."""
    try:
        import torchaudio.functional as taf

        reference = taf.rnnt_loss
    except (ImportError, AttributeError, OSError) as e:
        print(f"!! torchaudio rnnt_loss unavailable ({e}): the comparison did NOT run", flush=True)
        return {"ran": False, "reason": str(e)}
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, frames, labels, vocab = 8, 120, 40, 1024
    logits = (torch.randn(batch, frames, labels + 1, vocab + 1, generator=gen, device="cuda") * 2).requires_grad_()
    targets = torch.randint(0, vocab, (batch, labels), generator=gen, device="cuda", dtype=torch.int32)
    logit_lengths = torch.randint(frames // 2, frames + 1, (batch,), generator=gen, device="cuda", dtype=torch.int32)
    logit_lengths[0] = frames
    target_lengths = torch.randint(1, labels + 1, (batch,), generator=gen, device="cuda", dtype=torch.int32)
    target_lengths[0] = labels

    def ours():
        loss = rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=vocab, reduction="none")
        return loss, torch.autograd.grad(loss.sum(), logits)[0]

    def theirs():
        loss = reference(logits, targets, logit_lengths, target_lengths, blank=vocab, reduction="none")
        return loss, torch.autograd.grad(loss.sum(), logits)[0]

    our_loss, our_grad = ours()
    their_loss, their_grad = theirs()
    loss_diff = float((our_loss - their_loss).abs().max())
    rel_loss_diff = float(((our_loss - their_loss).abs() / their_loss.abs()).max())
    grad_diff = float((our_grad - their_grad).abs().max())
    ok = rel_loss_diff < 1e-4 and grad_diff < 1e-4
    if not ok:
        failures.append(f"rnnt_loss vs torchaudio: rel loss diff {rel_loss_diff:.2e}, grad diff {grad_diff:.2e}")
    ours_time, theirs_time = time_cuda(ours, repeat=5, warmup=1), time_cuda(theirs, repeat=5, warmup=1)
    return {"ran": True, "agree": ok, "shape": [batch, frames, labels + 1, vocab + 1],
            "max_abs_loss_diff": loss_diff, "max_rel_loss_diff": rel_loss_diff, "max_abs_grad_diff": grad_diff,
            "losses_ours": our_loss.tolist(), "losses_torchaudio": their_loss.tolist(),
            "ours_s": ours_time, "torchaudio_s": theirs_time,
            "ours_over_torchaudio_time": ours_time["median"] / theirs_time["median"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for models.json")
    parser.add_argument("--models", nargs="*", default=MODELS, help="model names (default: %(default)s)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    failures: list[str] = []
    loss_check = torchaudio_check(failures)
    print(f"torchaudio check: {loss_check}", flush=True)
    params, rows = {}, []
    for name in args.models:
        params[name], model_rows = measure_model(name, SHAPES, failures)
        rows.extend(model_rows)
    ratios = []
    for bf16 in (r for r in rows if r["dtype"] == "bf16" and "step_s" in r):
        match = [r for r in rows if r["dtype"] == "fp32" and "step_s" in r and r["model"] == bf16["model"]
                 and r["batch_size"] == bf16["batch_size"] and r["duration_s"] == bf16["duration_s"]]
        if match:
            fp32 = match[0]
            ratios.append({"model": bf16["model"], "batch_size": bf16["batch_size"], "duration_s": bf16["duration_s"],
                           "fp32_over_bf16_time": fp32["step_s"]["median"] / bf16["step_s"]["median"],
                           "fp32_over_bf16_peak_memory": fp32["peak_bytes"] / bf16["peak_bytes"]})
    total_s = time.perf_counter() - started
    path = write_result("models", what="training-step time and peak memory of the reference models (bf16 vs "
                        "fp32), and our RNN-T loss against torchaudio's",
                        figures={"steps": rows, "bf16_vs_fp32": ratios, "parameters": params,
                                 "rnnt_loss_vs_torchaudio": loss_check, "failures": failures,
                                 "bench_wall_s": total_s},
                        params={"models": args.models, "shapes": SHAPES, "timed_steps": 3, "warmup_steps": 1,
                                "tf32_matmul": torch.backends.cuda.matmul.allow_tf32},
                        out_dir=args.out)

    print(f"\nwrote {path} in {total_s:.0f} s")
    print(f"{'model':<11} {'params':>8} {'B':>3} {'sec':>5} {'U':>4} {'bf16 ms':>9} {'fp32 ms':>9} "
          f"{'fp32/bf16':>9} {'bf16 GiB':>9} {'fp32 GiB':>9}")
    for r in ratios:
        b = next(x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                 and x["dtype"] == "bf16")
        f = next(x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                 and x["dtype"] == "fp32")
        print(f"{r['model']:<11} {params[r['model']] / 1e6:>7.0f}M {r['batch_size']:>3} {r['duration_s']:>5g} "
              f"{b['num_tokens']:>4} {b['step_s']['median'] * 1e3:>9.1f} {f['step_s']['median'] * 1e3:>9.1f} "
              f"{r['fp32_over_bf16_time']:>9.2f} {b['peak_bytes'] / 2**30:>9.1f} {f['peak_bytes'] / 2**30:>9.1f}")
    for r in rows:
        if r.get("oom"):
            print(f"OOM: {r['model']} {r['dtype']} B={r['batch_size']} {r['duration_s']}s")
    if loss_check.get("ran"):
        print(f"rnnt_loss vs torchaudio: max rel loss diff {loss_check['max_rel_loss_diff']:.2e}, max grad diff "
              f"{loss_check['max_abs_grad_diff']:.2e}, ours/torchaudio time "
              f"{loss_check['ours_over_torchaudio_time']:.2f}x")
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
