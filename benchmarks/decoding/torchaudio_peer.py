"""The outside reference: torchaudio's RNNTBeamSearch, beam 1, on an equal-sized torchaudio RNN-T."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.decoding.methods import BLANK, FRAME_S, JOINT, PRED, VOCAB
from workbench.timing import timer_for


def torchaudio_reference(frames_list: list[int], device: torch.device) -> list[dict[str, Any]]:
    """torchaudio RNNTBeamSearch, beam 1, B=1, fp32, on an equal-sized torchaudio RNN-T (encoder given)."""
    try:  # optional dependency: torchaudio is on the GPU machines, not in pyproject.toml
        from torchaudio.models import RNNT, RNNTBeamSearch
        from torchaudio.models.rnnt import _Joiner, _Predictor
    except ImportError as e:  # torchaudio missing or the API removed
        print(f"torchaudio reference unavailable: {e}")
        return [{"method": "torchaudio RNNTBeamSearch beam 1", "unavailable": str(e)}]

    class PassThrough(torch.nn.Module):
        def forward(self, x, lengths):
            return x, lengths

        def infer(self, x, lengths, states):
            return x, lengths, []

    torch.manual_seed(0)
    predictor = _Predictor(num_symbols=VOCAB + 1, output_dim=JOINT, symbol_embedding_dim=PRED,
                           num_lstm_layers=1, lstm_hidden_dim=PRED)
    model = RNNT(PassThrough(), predictor, _Joiner(JOINT, VOCAB + 1)).to(device).eval()
    search = RNNTBeamSearch(model, BLANK, step_max_tokens=10)
    rows = []
    with torch.inference_mode():
        short = torch.randn(1, 50, JOINT, device=device)
        low, high = -20.0, 20.0
        for _ in range(8):  # coarse blank-bias bisection towards 1 label per 3 frames
            mid = (low + high) / 2
            model.joiner.linear.bias[BLANK] = mid
            rate = (len(search(short, torch.tensor([50], device=device), 1)[0][0]) - 1) / 50
            low, high = (mid, high) if rate > 1 / 3 else (low, mid)
        model.joiner.linear.bias[BLANK] = (low + high) / 2
        for frames in frames_list:
            enc = torch.randn(1, frames, JOINT, device=device)
            length = torch.tensor([frames], device=device)
            labels = len(search(enc, length, 1)[0][0]) - 1
            t = timer_for(device)(lambda: search(enc, length, 1), repeat=3 if frames <= 150 else 1,
                                  warmup=1 if frames <= 150 else 0)
            rows.append({"model": "rnnt", "dtype": "float32", "batch": 1, "frames": frames,
                         "audio_seconds": frames * FRAME_S, "method": "torchaudio RNNTBeamSearch beam 1",
                         "time_s": t, "audio_s_per_s": frames * FRAME_S / t["median"],
                         "labels_per_frame": labels / frames})
    return rows
