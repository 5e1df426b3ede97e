"""Our pure-PyTorch RNN-T loss against torchaudio.functional.rnnt_loss: loss and gradients on the same
random logits, and the time of each."""

from __future__ import annotations

import torch

from workbench.models import rnnt_loss
from workbench.timing import timer_for

LOSS_SHAPE = (8, 120, 40, 1024)  # (batch, frames, labels, vocab) of the loss comparison


def random_lattice(shape, device: torch.device) -> tuple:
    """(logits requiring grad, targets, logit lengths, target lengths) for ``shape`` = (batch, frames, labels,
    vocab), seeded; the first utterance has every frame and label."""
    batch, frames, labels, vocab = shape
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(batch, frames, labels + 1, vocab + 1, generator=gen, device=device) * 2).requires_grad_()
    targets = torch.randint(0, vocab, (batch, labels), generator=gen, device=device, dtype=torch.int32)
    logit_lengths = torch.randint(frames // 2, frames + 1, (batch,), generator=gen, device=device, dtype=torch.int32)
    logit_lengths[0] = frames
    target_lengths = torch.randint(1, labels + 1, (batch,), generator=gen, device=device, dtype=torch.int32)
    target_lengths[0] = labels
    return logits, targets, logit_lengths, target_lengths


def torchaudio_loss():
    """torchaudio.functional.rnnt_loss, or the one-line reason it is unavailable (torchaudio is on the GPU
    machines, not in pyproject.toml)."""
    try:
        import torchaudio.functional as taf

        return taf.rnnt_loss, None
    except (ImportError, AttributeError, OSError) as e:
        return None, f"torchaudio rnnt_loss unavailable: {e}"


def torchaudio_check(failures: list[str], *, device: torch.device, shape=LOSS_SHAPE, repeat: int = 5) -> dict:
    """Our rnnt_loss vs torchaudio's on the same random logits: values, gradients, time (:func:`timer_for`
    seconds). Ours always runs (its loss and gradient must be finite); the comparison needs torchaudio. A
    failed or disagreeing comparison is a failure; the returned dict says why it did not run ("reason")."""
    logits, *rest = random_lattice(shape, device)
    out = {"ran": False, "shape": [shape[0], shape[1], shape[2] + 1, shape[3] + 1], "device": str(device)}

    def loss_and_grad(loss_fn):
        loss = loss_fn(logits, *rest, blank=shape[3], reduction="none")
        return loss, torch.autograd.grad(loss.sum(), logits)[0]

    def ours():
        return loss_and_grad(rnnt_loss)

    try:
        our_loss, our_grad = ours()
    except Exception as e:  # noqa: BLE001 - recorded as the check's reason; the model rows still run
        failures.append(f"our rnnt_loss failed: {type(e).__name__}: {e}")
        return {**out, "reason": f"our rnnt_loss failed: {e}"}
    out["losses_ours"] = our_loss.tolist()
    if not (torch.isfinite(our_loss).all() and torch.isfinite(our_grad).all()):
        failures.append("our rnnt_loss: loss or gradient not finite")
    reference, why = torchaudio_loss()
    if reference is None:
        print(f"!! {why}: the comparison did NOT run", flush=True)
        return {**out, "reason": why}

    def theirs():
        return loss_and_grad(reference)

    try:
        their_loss, their_grad = theirs()
    except Exception as e:  # noqa: BLE001 - a torchaudio build problem must not lose the model rows
        failures.append(f"torchaudio rnnt_loss failed: {type(e).__name__}: {e}")
        return {**out, "reason": f"torchaudio rnnt_loss failed: {e}"}
    out.update(agreement(our_loss, our_grad, their_loss, their_grad, failures))
    ours_time = timer_for(device)(ours, repeat=repeat, warmup=1)
    theirs_time = timer_for(device)(theirs, repeat=repeat, warmup=1)
    return {**out, "ran": True, "losses_torchaudio": their_loss.tolist(), "ours_s": ours_time,
            "torchaudio_s": theirs_time, "ours_over_torchaudio_time": ours_time["median"] / theirs_time["median"]}


def agreement(our_loss, our_grad, their_loss, their_grad, failures: list[str]) -> dict:
    """{"agree", "max_abs_loss_diff", "max_rel_loss_diff", "max_abs_grad_diff"}; a disagreement is a failure.

    Gradients are probability differences in [-1, 1]; fp32 posteriors exp(alpha + beta - L) at a
    log-likelihood L near 1e3 carry about L * 2**-23 ~ 1e-4 relative error: 1e-3 absolute is fp32 noise
    (models.json records the measured max_abs_grad_diff), a wrong lattice term is off by 1e-2 or more."""
    loss_diff = float((our_loss - their_loss).abs().max())
    rel_loss_diff = float(((our_loss - their_loss).abs() / their_loss.abs()).max())
    grad_diff = float((our_grad - their_grad).abs().max())
    ok = rel_loss_diff < 1e-4 and grad_diff < 1e-3
    if not ok:
        failures.append(f"rnnt_loss vs torchaudio: rel loss diff {rel_loss_diff:.2e}, grad diff {grad_diff:.2e}")
    return {"agree": ok, "max_abs_loss_diff": loss_diff, "max_rel_loss_diff": rel_loss_diff,
            "max_abs_grad_diff": grad_diff}
