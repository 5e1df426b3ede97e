"""`workbench train`: the training recipe in workbench/training/recipe.py from the command line."""

from __future__ import annotations

import argparse
import dataclasses

from workbench.models.config import DEFAULT_JOINT_LOSS, JOINT_LOSSES
from workbench.options import DROP_NOTICE_SHARE, WORKER_NICENESS


def check_options_apply(args: argparse.Namespace) -> None:
    """Refuse, naming it, an option that cannot apply: the batch options of lhotse's sampler with --profile (the
    profile's bins and batch sizes make the batches), --no-concurrent and --strict without one (lhotse's sampler
    has no background thread, and no bins to check)."""
    if args.profile is not None:
        for option, value in (("--max-duration", args.max_duration), ("--num-buckets", args.num_buckets)):
            if value is not None:
                raise ValueError(f"{option}: applies without --profile only (the profile's bins and batch sizes "
                                 "make the batches); leave out one of them")
    elif args.concurrent is False:
        raise ValueError("--no-concurrent: applies with --profile only (without one, batches come from lhotse's "
                         "sampler, which buckets in this thread already)")
    elif args.strict:
        raise ValueError("--strict: applies with --profile only (it refuses a profile whose bins leave out more "
                         "than 1 % of the corpus); without one nothing would be checked")


def _train(args: argparse.Namespace) -> int:
    from workbench.training.recipe import TrainConfig, train  # here: torch and lhotse load only for `train`

    check_options_apply(args)

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    config = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
    summary = train(config)
    losses = summary["losses"]
    if summary["checkpoint"]:  # rank 0
        print(f"trained {config.model} for {summary['steps']} steps on {summary['world_size']} process(es): "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, {summary['audio_seconds_per_second']:.1f} audio s/s, "
              f"data wait {100 * summary['data_wait_share']:.1f} %; saved {summary['checkpoint']}")
        for warning in summary["warnings"]:
            print(f"warning: {warning}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a workbench model on a lhotse corpus (torchrun for several GPUs)",
        description="Train a model on a lhotse CutSet with audio; saves <out>/model.pt, train_log.jsonl and\n"
                    "train_summary.json. Several GPUs: torchrun --nproc-per-node N -m workbench train ...\n"
                    "(DistributedDataParallel; give it a profile made with `workbench oomptimize --ddp` or\n"
                    "`--nproc N`). Several machines: add torchrun's --nnodes M --node-rank R\n"
                    "--rdzv-endpoint HOST:PORT.",
        epilog="examples:\n"
               "  workbench train --cuts work/tts/cuts.jsonl.gz --tokenizer work/tts/tokenizer_bpe_128.model \\\n"
               "      --out work/run --steps 3 --max-duration 30 --device cpu --dtype fp32\n"
               "  workbench train --cuts cuts.jsonl.gz --tokenizer tok.model --out runs/large --model large-rnnt \\\n"
               "      --profile profile.yaml --steps 20000 --save-every 1000\n"
               "  torchrun --nproc-per-node 4 -m workbench train --cuts cuts.jsonl.gz --tokenizer tok.model \\\n"
               "      --out runs/ddp --model large-rnnt --profile profile_ddp.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cuts", required=True, help="lhotse CutSet manifest with audio (.jsonl or .jsonl.gz)")
    p.add_argument("--tokenizer", required=True, help="sentencepiece .model; its size sets the model's vocabulary")
    p.add_argument("--out", dest="out_dir", required=True,
                   help="output folder for model.pt, train_log.jsonl and train_summary.json")
    p.add_argument("--model", default="tiny-rnnt", help="{tiny,large,xl}-{rnnt,tdt,ctc,aed} (default tiny-rnnt)")
    p.add_argument("--profile", help="bucket profile YAML with batch sizes (default: lhotse max_duration batches); "
                                     "under torchrun, one made with `oomptimize --ddp` or `--nproc N`")
    p.add_argument("--max-duration", type=float,
                   help="without a profile: seconds of audio per batch (default 200)")
    p.add_argument("--num-buckets", type=int, help="without a profile: lhotse duration buckets (default 10)")
    p.add_argument("--steps", type=int, help="optimizer steps; epochs repeat as needed (default 1000)")
    p.add_argument("--max-seconds", type=float,
                   help="also stop after this many wall seconds of training (0: no limit; not under torchrun) "
                        "(default 0)")
    p.add_argument("--lr", type=float, help="peak AdamW learning rate (default 1e-3)")
    p.add_argument("--warmup-steps", type=int,
                   help="steps of linear warm-up, then cosine decay to 0 at --steps (default 100)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], help="bf16 autocast or fp32 (default bf16)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--log-every", type=int, help="steps between log lines (default 10)")
    p.add_argument("--seed", type=int, help="random seed of model init and sampler shuffling (default 0)")
    p.add_argument("--save-every", type=int,
                   help="steps between resumable <out>/train_state.pt saves (0: none, only model.pt at the end) "
                        "(default 0)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from <out>/train_state.pt (same corpus, model and sampler settings)")
    p.add_argument("--overwrite", action="store_true", default=None,
                   help="start over in an --out folder that holds a run (its train_state.pt is removed first); "
                        "without it, or --resume, such a folder is refused")
    p.add_argument("--no-concurrent", dest="concurrent", action="store_false", default=None,
                   help="with --profile: bucket without the background thread, so a resume is exact "
                        "(always off under torchrun)")
    p.add_argument("--num-workers", type=int,
                   help="DataLoader processes reading and collating audio (0: in the main process) (default: "
                        "this machine's cores shared among its ranks, less one, at most 16)")
    p.add_argument("--prefetch-factor", type=int, help="batches each DataLoader worker prepares ahead (default 2)")
    p.add_argument("--worker-niceness", type=int,
                   help="nice levels (0-19) the DataLoader workers run below the training process, so that where "
                        "they share cores the process that launches the GPU's work goes first (0: the same "
                        f"priority) (default {WORKER_NICENESS})")
    p.add_argument("--strict", action="store_true", default=None,
                   help=f"fail when more than {100 * DROP_NOTICE_SHARE:g}%% of the corpus fits no bucket of the "
                        "profile (default: warn)")
    p.add_argument("--joint-chunk-size", type=int,
                   help="transducers: joint and loss over chunks of this many utterances, never the whole "
                        "[B, T, U+1, V] joint at once (0: off; use the value the profile was made with) (default 0)")
    p.add_argument("--loss", choices=JOINT_LOSSES,
                   help="transducers: 'materialized' builds the joint's [B, T, U+1, V] logits, then the loss; "
                        "'fused' computes joint and loss in tiles and never builds them (same loss and gradients); "
                        f"use the value the profile was made with (default {DEFAULT_JOINT_LOSS})")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile each encoder block (dynamic shapes, compiled on the first step); give it "
                        "a profile made with `workbench oomptimize --compile`")
    p.add_argument("--log-cut-ids", action="store_true", default=None,
                   help="list every rank's cut ids in each train_log.jsonl record (under torchrun a gather per "
                        "step, which waits for the GPU: for checks, not for speed)")
    p.set_defaults(func=_train)
