"""`workbench check-model` and `oomptimize --model MODULE:CALLABLE`: ok lines, one-line errors, nothing written."""

import pytest

from workbench.bucketing import BucketProfile, save_profile
from workbench.cli import main

MODEL_FILE = '''
import torch
from workbench.adapters import FeatureInput, SchemaModel, TokenInput

def build():
    net = torch.nn.Linear(4, 1)
    return SchemaModel(net, [FeatureInput(dim=4), TokenInput(vocab_size=7)],
                       lambda m, b: m(b["features"]).mean() + 0 * b["tokens"].sum())

def lossless():
    return SchemaModel(torch.nn.Linear(4, 1), [FeatureInput(dim=4)], lambda m, b: m(b["features"]))
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL_FILE)
    return path


def test_check_model_runs_the_smallest_bucket_of_the_bins(model_file, tmp_path, capsys):
    bins = save_profile(tmp_path / "bins.yaml", BucketProfile([[1.5, 12], [4.0, 30]], None, [9.0, 8.0]))
    assert main(["check-model", f"{model_file}:build", "--bins", str(bins), "--device", "cpu"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"ok: {model_file}:build:") and "1.5 s / 12 tokens" in out
    assert "features[2, 150, 4]" in out and len(out.splitlines()) == 1


@pytest.mark.parametrize("args, needle", [
    (["{file}:lossless"], "the loss function returned [2, 300, 1]; it must be a scalar"),
    (["{file}:nothing"], "has no attribute 'nothing'"),
    (["large-rnnt"], "expected MODULE:CALLABLE or an adapter's name"),
    (["{file}:build", "--batch-size", "0"], "--batch-size: must be >= 1"),
    (["{file}:build", "--bins", "{dir}/none.yaml"], "none.yaml: no such profile file"),
])
def test_check_model_errors_are_one_line(model_file, capsys, args, needle):
    args = [a.format(file=model_file, dir=model_file.parent) for a in args]
    assert main(["check-model", *args, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("workbench check-model: error:") and needle in err and "\n" not in err


@pytest.mark.parametrize("model, needle", [
    ("bogus", "neither a reference model (e.g. large-rnnt), an adapter"),
    ("{file}:missing", "has no attribute 'missing'"),
    ("no_such_module_xyz:build", "no module named 'no_such_module_xyz'"),
])
def test_oomptimize_refuses_a_bad_model_before_any_gpu_work(model_file, tmp_path, capsys, model, needle):
    bins = save_profile(tmp_path / "bins.yaml", BucketProfile([[1.5, 12]], None, [9.0]))
    before = bins.read_bytes()
    assert main(["oomptimize", "--model", model.format(file=model_file), "--bins", str(bins),
                 "--out", str(tmp_path / "out.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert bins.read_bytes() == before and not (tmp_path / "out.yaml").exists()


def test_oomptimize_refuses_reference_only_options_for_a_user_model(model_file, tmp_path, capsys):
    bins = save_profile(tmp_path / "bins.yaml", BucketProfile([[1.5, 12]], None, [9.0]))
    assert main(["oomptimize", "--model", f"{model_file}:build", "--bins", str(bins), "--compile"]) == 2
    assert "--compile: applies to the reference models only" in capsys.readouterr().err
