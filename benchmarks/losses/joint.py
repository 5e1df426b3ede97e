"""The joint and loss alone, from the encoder's and predictor's outputs to the gradients of the joint's inputs
and weights: the logits built then our Triton loss (materialized), the fused joint + loss (no logits), and
the logits built then torchaudio's ``rnnt_loss`` on them in fp32 (it takes no bf16), on the same inputs.

The inputs are a reference model's real encoder and predictor outputs for a bucket's worst-case batch.
"""

from __future__ import annotations

import torch

from benchmarks.losses.worker import peak_above_inputs, profiled_kernels
from benchmarks.mfu import gemm_seconds
from workbench.records.losses import JointLossRun
from workbench.timing import timer_for

JOINT_IMPLS = ("materialized", "fused", "torchaudio")
# The joint's output-layer GEMMs over every lattice node in one forward + backward: the logits, then the
# gradients of the hidden units and of the weights; the fused path makes each tile's logits again in the backward.
OUTPUT_LAYER_GEMMS = {"materialized": 3, "fused": 4, "torchaudio": 3}
# Rows of the GEMM that measures the output layer's rate: the materialized path's order of size (B x T x (U + 1)
# is 1.45e6 at B=64 x 15 s). The fused path's tiles are smaller (2**26 outputs, about 2**16 rows) and no faster
# per FLOP, so the time this rate gives is a lower bound for both.
RATE_ROWS = 2**20
TORCHAUDIO_MAX_LOGITS = 2**31 - 1  # past it torchaudio's kernel can fail with an illegal memory access


def output_layer_gemm_flops_per_s(rows: int, hidden: int, outputs: int, device, dtype) -> float:
    """FLOP/s of the output layer's GEMM on ``rows`` nodes at the training layout's :func:`padded_width`
    outputs (unpadded, 1025 outputs give rows of 2050 bytes, off the 16-byte alignment Hopper's tensor-memory
    copies need, and a GEMM far slower than the layer's)."""
    from workbench.models.transducer import padded_width

    width = padded_width(outputs)
    return 2.0 * rows * hidden * width / gemm_seconds(rows, hidden, width, device, dtype)["median"]


def joint_inputs(model, batch_size: int, seconds: float, tokens: int, device: torch.device, dtype: torch.dtype):
    """(enc [B, T, D], pred [B, U + 1, H]) requiring grad, tokens, enc_lens, token_lens: the model's encoder
    and predictor outputs for ``batch_size`` items of ``seconds`` and ``tokens`` labels."""
    batch = model.make_batch(batch_size, seconds, tokens, device)
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        enc, enc_lens = model.encode(batch["audio"], batch["audio_lens"])
        pred = model.predictor(batch["tokens"])
    return (enc.detach().requires_grad_(), pred.detach().requires_grad_(), batch["tokens"], enc_lens,
            batch["token_lens"])


def joint_loss_function(impl: str, model, dtype: torch.dtype):
    """(enc, pred, tokens, enc_lens, token_lens) -> summed loss of ``model``'s joint and loss by ``impl``."""
    from workbench.models.fused_joint_loss import fused_joint_loss
    from workbench.models.losses import rnnt_loss

    joint, blank = model.joint, model.blank_id
    autocast = dict(device_type=next(model.parameters()).device.type, dtype=dtype, enabled=dtype != torch.float32)

    def materialized(enc, pred, tokens, enc_lens, token_lens):
        with torch.autocast(**autocast):
            logits = joint(enc, pred, padded=True)
        return rnnt_loss(logits, tokens, enc_lens, token_lens, blank=blank, reduction="sum", check="device",
                         num_classes=joint.num_outputs)

    def fused(enc, pred, tokens, enc_lens, token_lens):
        with torch.autocast(**autocast):
            return fused_joint_loss(joint, enc, pred, tokens, enc_lens, token_lens, blank=blank, reduction="sum",
                                    check="device")

    def torchaudio(enc, pred, tokens, enc_lens, token_lens):
        import torchaudio.functional as taf

        with torch.autocast(**autocast):
            logits = joint(enc, pred)
        return taf.rnnt_loss(logits.float(), tokens.int(), enc_lens.int(), token_lens.int(), blank=blank,
                             reduction="sum")

    functions = {"materialized": materialized, "fused": fused, "torchaudio": torchaudio}
    if impl not in functions:
        raise ValueError(f"impl: expected one of {JOINT_IMPLS}, got {impl!r}")
    return functions[impl]


def _relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| over the largest |want|."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-12))


def joint_loss_runs(name: str, batch_size: int, seconds: float, tokens: int, device: torch.device, *,
                    dtype: torch.dtype, repeat: int, impls=JOINT_IMPLS) -> list[JointLossRun]:
    """Each of ``impls`` on the same inputs: time and peak memory of forward + backward, its loss, and (besides
    the materialized path) its largest loss and gradient differences from the materialized path's."""
    from workbench.memory.oom import release_memory
    from workbench.models import build_model

    with device:
        model = build_model(name)
    model.train()
    inputs = joint_inputs(model, batch_size, seconds, tokens, device, dtype)
    enc, pred = inputs[:2]
    wrt = [enc, pred, *model.joint.parameters()]
    num_outputs = model.joint.num_outputs
    logits = batch_size * enc.shape[1] * pred.shape[1] * num_outputs
    hidden = model.joint.out.in_features
    one_pass_flops = 2.0 * logits * hidden  # one output-layer GEMM over every node
    rows = min(RATE_ROWS, logits // num_outputs)  # the output layer as one GEMM: its FLOP/s
    rate = output_layer_gemm_flops_per_s(rows, hidden, num_outputs, device, dtype)
    runs, reference = [], None
    for impl in impls:
        run = JointLossRun(impl=impl, model=name, batch_size=batch_size, duration_s=seconds, num_tokens=tokens,
                           frames=int(enc.shape[1]), outputs=num_outputs, logit_elements=logits,
                           dtype=str(dtype).removeprefix("torch."),
                           gemm_flops=OUTPUT_LAYER_GEMMS[impl] * one_pass_flops, gemm_flops_per_s=rate)
        if impl == "torchaudio" and logits > TORCHAUDIO_MAX_LOGITS:
            run.error = f"not run: {logits:.3g} logits, past torchaudio's 2**31"
            runs.append(run)
            continue
        fn = joint_loss_function(impl, model, dtype)

        def step():
            loss = fn(*inputs)
            return loss.detach(), torch.autograd.grad(loss, wrt)

        try:
            release_memory()
            loss, grads = step()
            run.loss = float(loss)
            if impl == "materialized":
                reference = (loss, grads)
            elif reference is not None:
                run.max_rel_loss_diff = float((loss - reference[0]).abs() / reference[0].abs().clamp_min(1e-6))
                run.max_rel_grad_diff = max(_relative_difference(g, r) for g, r in zip(grads, reference[1]))
            del loss, grads
            run.peak_above_inputs_bytes = peak_above_inputs(step, device)
            run.time_s = timer_for(device)(step, repeat=repeat, warmup=1)
            run.kernels = profiled_kernels(step) if device.type == "cuda" else None
        except Exception as e:  # noqa: BLE001 - an OOM or torchaudio's failure is a figure
            run.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        runs.append(run)
    model = inputs = enc = pred = wrt = reference = None  # the GPU memory back before the next shape
    release_memory()
    return runs
