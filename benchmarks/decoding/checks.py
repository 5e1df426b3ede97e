"""Hypothesis checks: each row against its size's reference, the bf16 token disagreement, where two decodings part."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.decoding.cases import Case, Outcome
from benchmarks.decoding.methods import BLANK, ours
from workbench.decoding.methods import DecoderMethod
from workbench.decoding.protocol import module_dtype

# bf16 frame-looping vs label-looping: one near-tie flips the rest of an utterance (each row's measured
# ``token_disagreement`` is in the decoding records); a wrong decision rule disagrees far more.
MAX_BF16_DISAGREEMENT = 0.25
SAME_MATH = {ours(m, kernels).label for kernels in ("torch", "triton_cudnn") for m in ("off", "partial", "full")}


def token_disagreement(hyps: list[list[int]], reference: list[list[int]]) -> float:
    """Edit distance between two decodings of the same utterances, over the longer sequence of each
    pair: 0 when equal, 1 when nothing matches (two empty decodings agree: 0)."""
    if len(hyps) != len(reference):
        raise ValueError(f"token_disagreement: {len(hyps)} hypotheses for {len(reference)} references")
    errors = total = 0
    for h, r in zip(hyps, reference):
        row = list(range(len(r) + 1))
        for i, a in enumerate(h, 1):
            prev, row[0] = row[0], i
            for j, b in enumerate(r, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (a != b))
        errors += row[-1]
        total += max(len(h), len(r))
    return errors / max(total, 1)


def check_row(case: Case, row: dict, outcome: Outcome) -> None:
    """Compare a row's tokens and frames with the case's reference. Our label-looping stages (torch or fused,
    off/partial/full) must agree exactly in every dtype. Frame-looping, window 1, fused+lstm (the LSTM step's
    sums in another order than cuDNN's) and NeMo run other GEMM shapes (or other kernels): exactly in fp32; in bf16 a near-tie can round either way and the rest of
    that utterance then follows another path, so there the token disagreement (edit distance) is reported (and,
    for our own methods, checked) instead. A row that differs gets ``first_difference``."""
    key, reference = row.pop("_key"), case.reference
    differing = sum(a != b for a, b in zip(zip(*key), zip(*reference))) if reference else case.batch
    row["reference_method"] = case.reference_method
    row["utterances_differing_from_reference"] = differing
    row["equal_to_reference"] = differing == 0
    if reference is not None and differing:
        row["first_difference"] = first_difference(reference, key)
        try:
            row["first_difference"].update(decision_margins(case, row["first_difference"], reference))
        except Exception as e:  # noqa: BLE001 - a diagnostic we cannot make is said, not fatal
            row["first_difference"]["margins_unavailable"] = f"{type(e).__name__}: {e}"
    if reference is not None and row["method"] not in SAME_MATH and case.dtype != torch.float32:
        row["token_disagreement"] = token_disagreement(key[0], reference[0])
        if row["token_disagreement"] > MAX_BF16_DISAGREEMENT and _algorithm(row) != "nemo":
            outcome.failures.append(f"{case.tag}: {row['method']}: token disagreement {row['token_disagreement']:.3f} "
                                    f"with {case.reference_method} (allowed {MAX_BF16_DISAGREEMENT} in bf16)")
    elif differing:
        outcome.failures.append(f"{case.tag}: {row['method']}: {differing} of {case.batch} utterances differ from "
                                f"{case.reference_method}")


def first_difference(reference: tuple, key: tuple) -> dict[str, Any] | None:
    """Where ``key``'s hypotheses first depart from ``reference``'s (each (tokens, frames) per utterance): the first
    differing utterance, the index of its first differing label, and each side's token and frame there (None
    past the end of a side's labels), with each side's label count in that utterance. None when equal."""
    for utterance, (ours_t, ours_f, theirs_t, theirs_f) in enumerate(zip(*reference, *key)):
        ours, theirs = list(zip(ours_t, ours_f)), list(zip(theirs_t, theirs_f))
        if ours == theirs:
            continue
        label = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        mine = ours[label] if label < len(ours) else (None, None)
        other = theirs[label] if label < len(theirs) else (None, None)
        return {"utterance": utterance, "label_index": label, "reference_token": mine[0], "reference_frame": mine[1],
                "token": other[0], "frame": other[1], "reference_labels": len(ours), "labels": len(theirs)}
    return None


@torch.inference_mode()
def decision_margins(case: Case, diff: dict, reference: tuple) -> dict[str, Any]:
    """Our joint at the first difference: the predictor after the common labels, at the earlier of the two sides'
    frames (the last frame when both ended): the top-2 tokens and their log-probability margin and, for TDT, the
    duration picked and the duration margin. A small margin is a rounding near-tie."""
    u, label = diff["utterance"], diff["label_index"]
    frames = [f for f in (diff["reference_frame"], diff["frame"]) if f is not None]
    frame = min(frames) if frames else int(case.lengths[u]) - 1
    prefix = reference[0][u][:label]
    p, j = case.predictor, case.joint
    labels = torch.full((1,), BLANK, dtype=torch.long, device=case.device)
    out, state = p.step(labels, p.init_state(1))
    for token in prefix:
        out, state = p.step(torch.full((1,), token, dtype=torch.long, device=case.device), state)
    enc = case.enc[u:u + 1, frame:frame + 1].to(module_dtype(j, case.enc.dtype))
    logits = j.joint_after_projection(j.project_encoder(enc)[:, 0], j.project_predictor(out))[0].float()
    v1 = logits.shape[0] - len(case.durations or [])
    top = torch.log_softmax(logits[:v1], dim=-1).topk(2)
    result = {"at_frame": frame, "top2_tokens": top.indices.tolist(),
              "top2_token_margin": float(top.values[0] - top.values[1])}
    if case.durations:
        top_d = torch.log_softmax(logits[v1:], dim=-1).topk(2)
        result.update(top2_durations=[case.durations[i] for i in top_d.indices.tolist()],
                      top2_duration_margin=float(top_d.values[0] - top_d.values[1]))
    return result


def _algorithm(row: dict) -> str | None:
    method = DecoderMethod.of_label(row["method"])
    return method.algorithm if method else None
