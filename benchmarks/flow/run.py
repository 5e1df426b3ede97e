"""Run the README's flow (the shell block after ``<!-- flow -->``) as a user types it, check what a user
checks, and write the ``flow`` record.

    python -m benchmarks.flow --out benchmarks/results [--workdir DIR] [--keep]

Each command runs in ``bash`` in the work folder, where ``workbench`` is this checkout's CLI. Then the
profile and checkpoints are loaded, the losses must fall, and a few utterances are decoded with
``GreedyTransducerDecoder`` from the trained checkpoint. Exit 1 if a command or a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass
class FlowRun:
    workdir: Path
    commands: list[dict[str, Any]] = field(default_factory=list)  # {"command", "seconds"} in order


def workbench_shim(workdir: Path) -> Path:
    """A folder holding a ``workbench`` executable that runs this checkout's CLI with this Python."""
    bin_dir = workdir / ".bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "workbench"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m workbench "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def run_commands(commands: list[str], workdir: Path, *, log=print) -> FlowRun:
    """Run each command in bash in ``workdir``, timed; raises FlowError at the first failure."""
    bin_dir = workbench_shim(workdir)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = FlowRun(workdir)
    for i, command in enumerate(commands):
        log(f"$ {command}")
        started = time.perf_counter()
        with open(workdir / f"command{i:02d}.log", "w") as out:
            done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - started
        tail = (workdir / f"command{i:02d}.log").read_text(errors="replace").splitlines()[-15:]
        log("\n".join(f"  {line[-200:]}" for line in tail if "it/s]" not in line and "s/it]" not in line))
        log(f"  -> exit {done.returncode} in {seconds:.1f} s")
        if done.returncode != 0:
            raise FlowError(f"`{command}` exited {done.returncode}:\n" + "\n".join(tail))
        run.commands.append({"command": command, "seconds": seconds})
    return run


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


def check_outputs(run: FlowRun, commands: list[str]) -> dict[str, Any]:
    """Load what the commands wrote and check it as a user would; returns the record's figures."""
    from workbench.records.flow import train_figures
    from workbench.bucketing import load_profile

    workdir = run.workdir
    trains = train_commands(commands)
    profile = load_profile(workdir / option_value(trains["train_profile"], "--profile"))
    meta = profile.metadata
    figures: dict[str, Any] = {"commands": run.commands}
    figures["profile"] = {"num_buckets": profile.num_buckets, "bins": profile.bucket_duration_bins,
                          "batch_sizes": profile.bucket_batch_size, "probes": meta.get("probes"),
                          "probes_per_bucket": meta.get("probes", 0) / max(1, meta.get("unmerged_buckets", 1)),
                          "soak_ooms": (meta.get("soak") or {}).get("ooms"), "torch": meta.get("torch")}
    checks = {"profile_has_positive_batch_sizes": bool(profile.bucket_batch_size)
              and all(b > 0 for b in profile.bucket_batch_size),
              "soak_ran_without_oom": (meta.get("soak") or {}).get("ooms") == 0}
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
    figures["checks"] = checks
    figures["failures"] = [name for name, ok in checks.items() if not ok]
    return figures


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.flow", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for flow.json")
    p.add_argument("--workdir", help="where the commands run (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--readme", default=str(REPO / "README.md"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from workbench.records.flow import summary_lines
    from benchmarks.harness import write_result

    args = parse_args(argv)
    commands = readme_flow_commands(args.readme)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="workbench_flow_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run = run_commands(commands, workdir)
        figures = check_outputs(run, commands)
        path = write_result("flow", what="the README's flow on this GPU: commands as typed, then the checks "
                            "a user makes", figures=figures, params={"commands": commands}, out_dir=args.out)
        record = json.loads(path.read_text())
        print("\n".join(summary_lines(record["figures"])))
        print(f"wrote {path}")
        return 1 if figures["failures"] else 0
    except FlowError as e:
        print(f"flow failed: {e}", file=sys.stderr)
        return 1
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(workdir, ignore_errors=True)
