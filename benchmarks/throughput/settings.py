"""What every piece of the throughput study shares: its models, limits and folders."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.records.throughput import record_name

MODELS = ("large-rnnt", "xl-aed")
SMOKE_MODELS = {"large-rnnt": "tiny-rnnt", "xl-aed": "tiny-aed"}  # --smoke trains these on the CPU
MAX_UTTERANCE_S = 40.0  # longer joined utterances are dropped from the corpus
LHOTSE_NUM_BUCKETS = 10  # the baseline's buckets (TrainConfig's default)
SUBBUCKETS = 2  # token sub-buckets per duration bucket of the 2D profiles
HISTOGRAM_BINS = 40  # bins of the corpus's tokens-per-second histogram
CORPUS_PRESETS = ("plain", "realistic")  # --corpus-preset: make_tts_corpus's preset (plain: none)
SMOKE_BATCH_AUDIO_S = 12.0  # smoke: the modelled memory budget holds this much padded audio per batch
TMP = Path("/tmp/workbench_throughput")


def trained_model(args: argparse.Namespace) -> str:
    """The model the study trains: ``--model``, or its tiny stand-in under ``--smoke``."""
    return SMOKE_MODELS[args.model] if args.smoke else args.model


def study_record_name(args: argparse.Namespace) -> str:
    """The record this run writes: throughput_<model>, with ``_<tag>`` for a ``--tag``ged variant."""
    tag = getattr(args, "tag", None)
    return record_name(args.model) + (f"_{tag}" if tag else "")


def workdir(args: argparse.Namespace) -> Path:
    """Where the runs go: ``--workdir``, else /tmp/workbench_throughput/<record>[_smoke]."""
    return Path(args.workdir or TMP / f"{study_record_name(args)}{'_smoke' if args.smoke else ''}")


def corpus_root(args: argparse.Namespace) -> Path:
    """The corpus folder: ``--corpus-dir``; else <workdir>/corpus under ``--smoke``, otherwise one folder per
    corpus (preset, utterances x join x repeat) that both models share."""
    if args.corpus_dir:
        return Path(args.corpus_dir)
    if args.smoke:
        return workdir(args) / "corpus"
    return TMP / f"corpus_{args.corpus_preset}_{args.utterances}x{args.join}x{args.repeat}"


def say(run, message: str) -> None:
    """Print ``message`` after the run's wall seconds so far."""
    print(f"[{run.seconds():6.1f} s] {message}", flush=True)


def device_memory_mib() -> int | None:
    """GPU 0's total memory in MiB as nvidia-smi reports it (no CUDA context is made in this process), or
    None without nvidia-smi or a GPU."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
