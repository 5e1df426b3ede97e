"""Run the README's flow (the shell block after ``<!-- flow -->``) as a user types it, check what a user
checks, and write the ``flow`` record.

    python -m benchmarks.flow --out benchmarks/results [--workdir DIR] [--keep]

Each command runs in ``bash`` in the work folder, where ``workbench`` is this checkout's CLI. Then the
profile and checkpoints are loaded, the losses must fall, and a few utterances are decoded with
``GreedyTransducerDecoder`` from the trained checkpoint. Exit 1 if a command or a check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from benchmarks.harness import bench_parser, start

REPO = Path(__file__).resolve().parents[2]
FLOW_MARKER = "<!-- flow -->"


class FlowError(RuntimeError):
    """A README command failed: names the command and ends with its last output lines."""


def readme_flow_commands(readme: str | os.PathLike = REPO / "README.md") -> list[str]:
    """The commands of the first fenced block after ``<!-- flow -->``: whole-line comments and blank lines
    dropped (also inside a continuation), backslash continuations joined; text after a ``#`` within a
    command line is kept (it may be inside quotes)."""
    lines = Path(readme).read_text().splitlines()
    if FLOW_MARKER not in lines:
        raise ValueError(f"{readme}: no '{FLOW_MARKER}' line before the flow's shell block")
    start = next(i for i in range(lines.index(FLOW_MARKER), len(lines)) if lines[i].startswith("```"))
    commands, pending = [], []
    for line in lines[start + 1:]:
        if line.startswith("```"):
            break
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        pending.append(text[:-1].strip() if text.endswith("\\") else text)
        if not text.endswith("\\"):
            commands.append(" ".join(pending))
            pending = []
    if not commands:
        raise ValueError(f"{readme}: the block after '{FLOW_MARKER}' has no commands")
    return commands


def workbench_shim(workdir: Path) -> Path:
    """A folder holding a ``workbench`` executable that runs this checkout's CLI with this Python."""
    bin_dir = workdir / ".bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "workbench"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m workbench "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def run_commands(commands: list[str], workdir: Path, *, log=print,
                 done: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Run each command in bash in ``workdir``, timed: one ``{"command", "seconds"}`` per command, appended
    to ``done`` (a new list by default) as each finishes; raises FlowError at the first failure."""
    bin_dir = workbench_shim(workdir)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = [] if done is None else done
    for i, command in enumerate(commands):
        log(f"$ {command}")
        started = time.perf_counter()
        with open(workdir / f"command{i:02d}.log", "w") as out:
            finished = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, stdout=out,
                                      stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - started
        tail = (workdir / f"command{i:02d}.log").read_text(errors="replace").splitlines()[-15:]
        log("\n".join(f"  {line[-200:]}" for line in tail if "it/s]" not in line and "s/it]" not in line))
        log(f"  -> exit {finished.returncode} in {seconds:.1f} s")
        if finished.returncode != 0:
            raise FlowError(f"`{command}` exited {finished.returncode}:\n" + "\n".join(tail))
        done.append({"command": command, "seconds": seconds})
    return done


def option_value(command: str, option: str) -> str | None:
    """The value after ``option`` in a command line (None when absent)."""
    words = command.split()
    return words[words.index(option) + 1] if option in words[:-1] else None


def train_commands(commands: list[str]) -> dict[str, str]:
    """{"train_profile": command, "train_max_duration": command}: the README's two train lines."""
    runs = {}
    for command in commands:
        if " train " in f" {command} ":
            runs["train_profile" if "--profile" in command.split() else "train_max_duration"] = command
    if set(runs) != {"train_profile", "train_max_duration"}:
        raise ValueError("the README flow must train once with --profile and once with --max-duration")
    return runs


def profile_figures(path: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    """The profile a user trains with: its buckets, batch sizes, probes (per merged bucket) and soak OOMs,
    and its checks."""
    from workbench.bucketing import load_profile

    profile = load_profile(path)
    meta = profile.metadata
    figures = {"num_buckets": profile.num_buckets, "bins": profile.bucket_duration_bins,
               "batch_sizes": profile.bucket_batch_size, "probes": meta.get("probes"),
               "probes_per_bucket": meta.get("probes", 0) / max(1, meta.get("unmerged_buckets", 1)),
               "soak_ooms": (meta.get("soak") or {}).get("ooms"), "torch": meta.get("torch")}
    checks = {"profile_has_positive_batch_sizes": bool(profile.bucket_batch_size)
              and all(b > 0 for b in profile.bucket_batch_size),
              "soak_ran_without_oom": (meta.get("soak") or {}).get("ooms") == 0}
    return figures, checks


def check_outputs(workdir: Path, commands: list[str]) -> tuple[dict[str, Any], dict[str, bool]]:
    """Load what the commands wrote and check it as a user would: the record's figures (profile, both
    training runs, decoding) and its checks (name -> passed)."""
    from workbench.records.flow import train_figures

    trains = train_commands(commands)
    figures: dict[str, Any] = {}
    figures["profile"], checks = profile_figures(workdir / option_value(trains["train_profile"], "--profile"))
    for key, command in trains.items():
        folder = workdir / option_value(command, "--out")
        summary = json.loads((folder / "train_summary.json").read_text())
        records = [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]
        figures[key] = {**train_figures(summary, records), "max_duration": float(option_value(command, "--max-duration"))
                        if key == "train_max_duration" else None}
        losses = [r["loss"] for r in records]
        checks[f"{key}_loss_falls"] = sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
        checks[f"{key}_batch_sizes_positive"] = all(r["batch_size"] > 0 for r in records)
    trained = trains["train_profile"]
    figures["decode"] = decode_a_few(workdir / option_value(trained, "--out") / "model.pt",
                                     workdir / option_value(trained, "--cuts"),
                                     workdir / option_value(trained, "--tokenizer"))
    # a model trained for a few steps mostly emits blanks: the check is that decoding runs and its
    # hypotheses are well formed; how many are non-empty is recorded, not required
    checks["decoder_runs_with_well_formed_hypotheses"] = figures["decode"]["valid"]
    return figures, checks


def decode_a_few(checkpoint: Path, cuts_path: Path, tokenizer_path: Path, num_cuts: int = 8) -> dict[str, Any]:
    """Load the checkpoint and decode ``num_cuts`` utterances greedily with the default graph mode."""
    import torch
    from lhotse import CutSet

    from workbench.data.tokenizer import load_tokenizer
    from workbench.decoding import GreedyTransducerDecoder
    from workbench.training.collate import collate_cuts
    from workbench.training.recipe import load_checkpoint

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_checkpoint(checkpoint, device=device)
    tokenizer = load_tokenizer(tokenizer_path)
    cuts = CutSet.from_file(cuts_path).subset(first=num_cuts)
    batch = {k: v.to(device) for k, v in collate_cuts(cuts, tokenizer).items()}
    decoder = GreedyTransducerDecoder(model.predictor, model.joint, blank_id=model.blank_id,
                                      durations=model.durations)
    with torch.inference_mode():
        enc, enc_lens = model.encode(batch["audio"], batch["audio_lens"])
        hyps = decoder(enc, enc_lens)
    valid = len(hyps) == len(cuts) and all(
        len(h.tokens) == len(h.timestamps) and all(0 <= t < model.vocab_size for t in h.tokens)
        and all(0 <= s < int(n) for s in h.timestamps) and list(h.timestamps) == sorted(h.timestamps)
        for h, n in zip(hyps, enc_lens.tolist()))
    return {"utterances": len(hyps), "tokens": [len(h.tokens) for h in hyps],
            "non_empty": sum(1 for h in hyps if len(h.tokens)),
            "texts": [tokenizer.decode(list(h.tokens)) for h in hyps[:3]],
            "graph_mode": getattr(decoder, "mode_used", "off"),
            "valid": bool(valid)}


@contextmanager
def work_folder(workdir: str | None, keep: bool) -> Iterator[Path]:
    """``workdir`` (made if missing, kept), else a temporary folder removed on exit unless ``keep``."""
    folder = Path(workdir or tempfile.mkdtemp(prefix="workbench_flow_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if not (keep or workdir):
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    from workbench.records.flow import summary_lines

    parser = bench_parser(__doc__, out_required=True)
    parser.prog = "python -m benchmarks.flow"
    parser.add_argument("--workdir", help="where the commands run (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--readme", default=str(REPO / "README.md"))
    run = start(parser, argv, name="flow", what="the README's flow on this GPU: commands as typed, then the "
                "checks a user makes", needs_cuda=False)
    commands = readme_flow_commands(run.args.readme)
    run.params["commands"] = commands
    with work_folder(run.args.workdir, run.args.keep) as workdir, run.part("flow"):
        run.figures["commands"] = []
        run_commands(commands, workdir, done=run.figures["commands"])
        figures, checks = check_outputs(workdir, commands)
        run.figures.update(figures, checks=checks)
        run.failures += [name for name, ok in checks.items() if not ok]
    print("\n".join(summary_lines(json.loads(run.save().read_text())["figures"])))
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
