"""`workbench oomptimize` / `python -m workbench.oomptimizer.cli` on a machine without CUDA, and the
torchrun relaunch command line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.oomptimizer import cli

REPO = Path(__file__).resolve().parents[2]


def run_module(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "workbench.oomptimizer.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_module_entry_without_cuda_is_one_clear_line(tmp_path):
    from workbench.bucketing.profile import BucketProfile, save_profile

    bins = save_profile(tmp_path / "P.yaml", BucketProfile([[5.0, 40], [10.0, 80]]))
    # --nproc must not relaunch under torchrun on a machine that cannot run it.
    proc = run_module("--model", "tiny-rnnt", "--bins", str(bins), "--nproc", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "workbench oomptimize: error: oomptimize needs a CUDA GPU (the probes run real " \
                                  "training steps)"
    assert "launching" not in proc.stdout and "Traceback" not in proc.stderr


def test_wrong_model_name_is_one_line_before_any_gpu_work(tmp_path, capsys):
    from workbench.bucketing.profile import BucketProfile, save_profile
    from workbench.cli import main

    bins = save_profile(tmp_path / "P.yaml", BucketProfile([[5.0, 40]]))
    assert main(["oomptimize", "--model", "large-rnnn", "--bins", str(bins)]) == 2
    err = capsys.readouterr().err
    # the model name is checked first: the error names it, not the missing GPU
    assert err.startswith("workbench oomptimize: error: --model 'large-rnnn': neither a reference model") \
        and "MODULE:CALLABLE" in err and "\n" not in err.strip()
    assert "CUDA" not in err and len(err.strip().splitlines()) == 1


def test_torchrun_relaunch_leaves_out_nproc(monkeypatch):
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    monkeypatch.setattr(sys, "argv", ["workbench", "oomptimize", "--model", "large-rnnt", "--nproc", "2",
                                      "--bins", "p.yaml", "--nproc=2", "--validate"])
    assert cli._relaunch_under_torchrun(2) == 0
    cmd = calls[0]
    assert cmd[cmd.index("-m", 3) + 1:] == ["workbench", "oomptimize", "--model", "large-rnnt", "--bins", "p.yaml",
                                           "--validate"]
    assert "--nproc_per_node=2" in cmd


def test_without_option():
    assert cli.without_option(["--a", "1", "--nproc", "2", "--nproc=3", "--nprocs", "x"], "--nproc") == \
        ["--a", "1", "--nprocs", "x"]


def test_malformed_profile_is_one_line_naming_the_file_before_any_gpu_work(tmp_path, capsys):
    from workbench.cli import main

    bad = tmp_path / "P.yaml"
    bad.write_text("foo: 1\n")
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "P.yaml: missing field 'bucket_duration_bins'" in err and "CUDA" not in err
