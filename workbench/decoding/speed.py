"""A small live speed table of the graph modes on this machine, in the decoding record's shape."""

from __future__ import annotations

from typing import Any

import torch

from workbench.timing import timer_for
from workbench.decoding import GreedyTransducerDecoder, label_looping, make_toy_transducer
from workbench.decoding.methods import DecoderMethod

FRAME_S = 0.08  # seconds of audio per encoder frame in the tables


def live_methods(device: torch.device, rnnt: bool) -> list[DecoderMethod]:
    """Frame-looping off (RNN-T), label-looping's torch stages in each graph mode the device runs, and the fused
    kernels in each where ``kernels="auto"`` picks them."""
    modes = ["off", "partial", "full"] if device.type == "cuda" else ["off"]
    methods = [DecoderMethod("frame_looping", "off")] if rnnt else []
    methods += [DecoderMethod("label_looping", mode) for mode in modes]
    kernels = label_looping.resolve_kernels("auto", device=device)[0]
    return methods + ([DecoderMethod("label_looping", mode, kernels) for mode in modes] if kernels != "torch" else [])


def live_speed_record(batches=(1, 4), frames: int = 20, repeat: int = 2, blank_bias: float = 4.0) -> dict[str, Any]:
    """A small measurement of the decoding table on this machine (CPU: eager modes only), in the record's
    shape: toy models (vocabulary 64), ``frames`` encoder frames per utterance, ``repeat`` timed calls."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    rows = []
    for model, durations in (("rnnt", None), ("tdt", [0, 1, 2, 3, 4])):
        predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=64,
                                               durations=durations, blank_bias=blank_bias, logit_scale=4.0,
                                               device=device)
        for b in batches:
            enc = torch.randn(b, frames, 32, device=device)
            lengths = torch.full((b,), frames, device=device)
            base = None
            for method in live_methods(device, rnnt=durations is None):
                dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations,
                                              **method.decoder_options())
                hyps = dec(enc, lengths)  # also the warm-up (and the graph capture)
                stats = dict(dec.last_stats)
                t = timer_for(device)(lambda: dec(enc, lengths), repeat=repeat, warmup=0)
                base = t["median"] if method.algorithm == "frame_looping" else base
                row = {"model": model, "dtype": "float32", "batch": b, "audio_seconds": frames * FRAME_S,
                       "method": method.label, "time_s": t,
                       "audio_s_per_s": b * frames * FRAME_S / t["median"],
                       "speedup_vs_frame_looping_off": None if base is None else base / t["median"],
                       "labels_per_frame": sum(len(h.tokens) for h in hyps) / (b * frames)}
                if "outer_iterations" in stats:
                    row["seconds_per_outer_iteration"] = t["median"] / max(1, stats["outer_iterations"])
                    row["outer_iterations"] = stats["outer_iterations"]
                rows.append(row)
    return {"figures": {"rows": rows, "empty_while_iteration": {"seconds_per_iteration": None}}}
