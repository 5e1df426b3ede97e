"""`workbench train`: the training recipe in workbench/models/train.py from the command line."""

from __future__ import annotations

import argparse
import dataclasses


def _train(args: argparse.Namespace) -> int:
    from workbench.models.train import TrainConfig, train  # here: torch and lhotse load only for `train`

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    config = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
    summary = train(config)
    losses = summary["losses"]
    print(f"trained {config.model} for {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{summary['audio_seconds_per_second']:.1f} audio s/s; saved {summary['checkpoint']}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a workbench model on a lhotse corpus",
                              description="Train a model on a lhotse CutSet; saves <out>/model.pt.")
    p.add_argument("--cuts", required=True, help="lhotse CutSet manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--tokenizer", required=True, help="sentencepiece .model")
    p.add_argument("--out", dest="out_dir", required=True, help="output folder for model.pt and train_log.jsonl")
    p.add_argument("--model", default="tiny-rnnt", help="{tiny,large,xl}-{rnnt,tdt,ctc,aed} (default tiny-rnnt)")
    p.add_argument("--profile", help="bucket profile YAML with batch sizes (else lhotse max_duration batches)")
    p.add_argument("--max-duration", type=float, help="seconds of audio per batch without a profile (200)")
    p.add_argument("--num-buckets", type=int, help="lhotse buckets without a profile (10)")
    p.add_argument("--steps", type=int, help="optimizer steps (1000)")
    p.add_argument("--lr", type=float, help="peak learning rate (1e-3)")
    p.add_argument("--warmup-steps", type=int, help="linear warm-up steps (100)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], help="bf16 autocast or fp32 (bf16)")
    p.add_argument("--device", help="cuda or cpu (cuda when available)")
    p.add_argument("--log-every", type=int, help="steps between log lines (10)")
    p.add_argument("--seed", type=int, help="random seed (0)")
    p.add_argument("--save-every", type=int, help="steps between resumable <out>/train_state.pt saves (0: none)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from <out>/train_state.pt (same corpus, model and sampler settings)")
    p.add_argument("--no-concurrent", dest="concurrent", action="store_false", default=None,
                   help="with --profile: bucket without the background thread, so a resume is exact")
    p.set_defaults(func=_train)
