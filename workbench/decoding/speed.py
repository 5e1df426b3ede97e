"""Decoder methods by name (algorithm, kernels, graph mode, blank window) as tables and records show them,
and a small live speed table of the graph modes on this machine, in the decoding record's shape."""

from __future__ import annotations

from typing import Any

import torch

from workbench.timing import timer_for
from workbench.decoding import GreedyTransducerDecoder, label_looping, make_toy_transducer

FRAME_S = 0.08  # seconds of audio per encoder frame in the tables
AUTO_WINDOW = "auto"  # the decoder's default blank window (greedy.auto_blank_window)
# "label_looping_fused": label-looping with the fused kernels that kernels="auto" picks on CUDA where Triton runs
# ("triton_cudnn", workbench.decoding.fused); "label_looping_fused_lstm": kernels="triton", the LSTM predictor's
# step fused too.
FUSED = "label_looping_fused"
FUSED_LSTM = "label_looping_fused_lstm"


def method_name(algorithm: str, mode: str, window: int | str = AUTO_WINDOW) -> str:
    """A method's name in tables and records: "label-looping fused full", "NeMo partial graphs", ..."""
    if algorithm == "nemo":
        return {"off": "NeMo no graphs", "partial": "NeMo partial graphs", "full": "NeMo full graph"}[mode]
    suffix = "" if window == AUTO_WINDOW else f" window {window}"
    if algorithm == FUSED:
        return f"label-looping fused {mode}{suffix}"
    if algorithm == FUSED_LSTM:
        return f"label-looping fused+lstm {mode}{suffix}"
    return f"{'frame' if algorithm == 'frame_looping' else 'label'}-looping {mode}{suffix}"


def live_speed_record(batches=(1, 4), frames: int = 20, repeat: int = 2, blank_bias: float = 4.0) -> dict[str, Any]:
    """A small measurement of the decoding table on this machine (CPU: eager modes only), in the record's
    shape: toy models (vocabulary 64), ``frames`` encoder frames per utterance, ``repeat`` timed calls."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    modes = ["off", "partial", "full"] if device.type == "cuda" else ["off"]
    rows = []
    for model, durations in (("rnnt", None), ("tdt", [0, 1, 2, 3, 4])):
        predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=64,
                                               durations=durations, blank_bias=blank_bias, logit_scale=4.0,
                                               device=device)
        for b in batches:
            enc = torch.randn(b, frames, 32, device=device)
            lengths = torch.full((b,), frames, device=device)
            methods = [("frame_looping", "off")] if durations is None else []
            base = None
            fused_rows = [(FUSED, m) for m in modes] if label_looping.resolve_kernels("auto", device=device)[0] != "torch" else []
            for algorithm, mode in methods + [("label_looping", m) for m in modes] + fused_rows:
                dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations,
                                              algorithm="label_looping" if algorithm == FUSED else algorithm,
                                              cuda_graphs=mode, kernels="triton_cudnn" if algorithm == FUSED else "torch")
                hyps = dec(enc, lengths)  # also the warm-up (and the graph capture)
                stats = dict(dec.last_stats)
                t = timer_for(device)(lambda: dec(enc, lengths), repeat=repeat, warmup=0)
                base = t["median"] if algorithm == "frame_looping" else base
                row = {"model": model, "dtype": "float32", "batch": b, "audio_seconds": frames * FRAME_S,
                       "method": method_name(algorithm, mode), "time_s": t,
                       "audio_s_per_s": b * frames * FRAME_S / t["median"],
                       "speedup_vs_frame_looping_off": None if base is None else base / t["median"],
                       "labels_per_frame": sum(len(h.tokens) for h in hyps) / (b * frames)}
                if "outer_iterations" in stats:
                    row["seconds_per_outer_iteration"] = t["median"] / max(1, stats["outer_iterations"])
                    row["outer_iterations"] = stats["outer_iterations"]
                rows.append(row)
    return {"figures": {"rows": rows, "empty_while_iteration": {"seconds_per_iteration": None}}}
