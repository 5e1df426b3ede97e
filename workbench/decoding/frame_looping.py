"""Classic frame-synchronous batched greedy RNN-T decoding: the baseline label-looping is measured against.

For each frame t (Python loop), up to ``max_symbols`` joint evaluations for the whole batch; a row
stops at this frame on its first blank; the loop over symbols ends as soon as no row emitted a label
(one host sync per evaluation). Same tokens, timestamps and scores as label-looping.
"""

from __future__ import annotations

import torch

import workbench.decoding.label_looping as label_looping
from workbench.decoding.label_looping import LoopBuffers, decide


def run_frame_looping(buf: LoopBuffers, predictor, joint, max_frames: int) -> dict[str, int]:
    """Decode the batch in ``buf`` (inputs loaded) frame by frame; returns the number of joint calls."""
    if buf.durations is not None:
        raise ValueError("frame_looping decodes RNN-T only (durations must be None)")
    label_looping.start(buf, predictor, joint)  # projections, zeroed outputs, predictor on the start symbol
    frame = torch.zeros((), dtype=torch.long, device=buf.timestamps.device)  # t on the device: no host copy
    evaluations = 0
    for t in range(max_frames):
        enc_t = buf.enc_proj[:, t]
        done = buf.lengths <= t
        for _ in range(buf.max_symbols):
            token, _, score = decide(buf, joint.joint_after_projection(enc_t, buf.pred_proj))
            evaluations += 1
            buf.scores.add_(torch.where(done, 0, score))
            emit = ~done & (token != buf.blank_id)
            done = done | ~emit
            if not label_looping.read_flag(emit.any()):
                break
            buf.tokens[buf.batch_index, buf.num_emitted] = token
            buf.timestamps[buf.batch_index, buf.num_emitted] = frame.fill_(t)
            buf.num_emitted.add_(emit.long())
            label_looping.advance_predictor(buf, predictor, joint, token, emit)
    return {"joint_evaluations": evaluations, "frames": max_frames}


