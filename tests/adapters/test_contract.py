"""The model contract: specs that name a model, the one-step check, and the declarative SchemaModel."""

import pytest
import torch
from torch import nn

from workbench.adapters import (AudioInput, FeatureInput, ModelContractError, SchemaModel, TokenInput,
                                build_model_from_spec, check_model, load_model_factory, user_model_spec)
from workbench.models import build_model
from workbench.oomptimizer.run import soak_batch


def _mean_loss(module, batch):
    enc = module(batch["audio"].unsqueeze(-1)).squeeze(-1)  # [B, S]
    mask = torch.arange(enc.shape[1])[None] < batch["audio_lens"][:, None]
    return (enc * mask).sum() / mask.sum() + 0 * batch["tokens"].sum()


def tiny_schema_model(**kw) -> SchemaModel:
    return SchemaModel(nn.Linear(1, 1), [AudioInput(sample_rate=100), TokenInput(vocab_size=7)], _mean_loss, **kw)


def test_reference_model_and_schema_model_pass_the_check():
    report = check_model(build_model("tiny-rnnt", vocab_size=16), spec="tiny-rnnt", bucket=(1.0, 4))
    assert report.batch_shapes["audio"] == [2, 16000] and report.trainable > 10
    assert report.line().startswith("ok: tiny-rnnt:")
    model = tiny_schema_model()
    report = check_model(model, bucket=(2.0, 5), batch_size=3)
    assert report.batch_shapes == {"audio": [3, 200], "audio_lens": [3], "tokens": [3, 5], "token_lens": [3]}
    assert all(p.grad is None for p in model.parameters())  # the check zeroes the gradients it made


def test_schema_inputs_build_worst_case_batches():
    feats = FeatureInput(key="x", dim=4, frame_rate=10.0, channels_first=True, fixed_frames=50, extra_frames=3)
    model = SchemaModel(nn.Linear(1, 1), [feats, TokenInput(vocab_size=9, low=3, max_tokens=6)], _mean_loss)
    batch = model.make_batch(2, 2.05, 6, "cpu", seed=1)
    assert batch["x"].shape == (2, 4, 53) and batch["feature_lens"].tolist() == [21, 21]
    assert batch["tokens"].min() >= 3 and batch["tokens"].max() < 9 and batch["token_lens"].tolist() == [6, 6]
    assert torch.equal(model.make_batch(2, 2.05, 6, "cpu", seed=1)["x"], batch["x"])
    with pytest.raises(ValueError, match="at most 6"):
        model.make_batch(2, 1.0, 7, "cpu")
    with pytest.raises(ValueError, match="at most 50 .5 s."):
        model.make_batch(2, 5.1, 2, "cpu")
    with pytest.raises(ValueError, match="keys repeat"):
        SchemaModel(nn.Linear(1, 1), [AudioInput(), AudioInput()], _mean_loss)


def test_soak_batch_shortens_every_length_key_but_the_first_row():
    model = SchemaModel(nn.Linear(1, 1), [FeatureInput(dim=2), TokenInput(vocab_size=5)], _mean_loss)
    batch = soak_batch(model, [(2.0, 10), (4.0, 20)], 1, 64, torch.device("cpu"))
    frames, tokens = batch["feature_lens"], batch["token_lens"]
    assert frames[0] == 400 and tokens[0] == 20
    assert frames.min() >= 200 and frames[1:].max() < 400 and tokens[1:].max() < 20 and tokens.min() >= 10


class _Broken(nn.Module):
    """A model that keeps the contract except for what ``fault`` breaks."""

    def __init__(self, fault: str):
        super().__init__()
        self.fault, self.used, self.unused = fault, nn.Linear(2, 2), nn.Linear(2, 2)

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        if self.fault == "make_batch raises":
            raise RuntimeError("no audio today")
        if self.fault == "list batch":
            return [1, 2]
        device = "meta" if self.fault == "batch on another device" else device
        rows = batch_size + (self.fault == "wrong batch size")
        return {"x": torch.ones(rows, 2, device=device), "x_lens": torch.full((rows,), 2.0 if
                self.fault == "float lengths" else 2, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        x = batch["y"] if self.fault == "missing key" else batch["x"]
        out = self.used(x)
        if self.fault != "unused parameter":
            out = out + self.unused(x)
        loss = {"vector loss": out.sum(0), "nan loss": out.sum() * float("nan")}.get(self.fault, out.sum())
        loss.sum().backward()
        return loss.detach()


@pytest.mark.parametrize("fault, needle", [
    ("make_batch raises", r"make_batch\(2, 3, 24, cpu\) raised RuntimeError: no audio today"),
    ("list batch", "returned a list, not a dict of tensors"),
    ("batch on another device", "batch\\['x'\\] is on meta, expected cpu"),
    ("wrong batch size", "batch\\['x'\\] has shape \\[3, 2\\]; the first dimension must be the batch \\(2\\)"),
    ("float lengths", "batch\\['x_lens'\\] is torch.float32; lengths are integers"),
    ("missing key", "training_step: the batch has no key 'y' \\(make_batch gave x, x_lens\\)"),
    ("vector loss", "a loss of shape \\[2\\]; it must be a scalar"),
    ("nan loss", "a loss of nan"),
    ("unused parameter", "2 of 4 trainable parameters got no gradient, e.g. 'unused.weight'"),
])
def test_check_names_what_breaks_the_contract(fault, needle):
    with pytest.raises(ModelContractError, match=needle) as e:
        check_model(_Broken(fault), spec="m:f")
    assert str(e.value).startswith("m:f: ") and "\n" not in str(e.value)


def test_check_names_a_parameter_on_the_wrong_device():
    model = _Broken("none")
    with torch.device("meta"):
        model.unused = nn.Linear(2, 2)
    with pytest.raises(ModelContractError, match="parameter 'unused.weight' is on meta, expected cpu"):
        check_model(model, spec="m:f")


MODEL_FILE = '''
import torch
from workbench.adapters import AudioInput, SchemaModel, TokenInput

def build():
    return SchemaModel(torch.nn.Linear(1, 1), [AudioInput(sample_rate=100), TokenInput(vocab_size=7)],
                       lambda m, b: m(b["audio"].unsqueeze(-1)).mean())

def raises():
    raise OSError("weights not found")

def not_a_model():
    return 42

def no_methods():
    return torch.nn.Linear(1, 1)

value = 3
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(MODEL_FILE)
    return path


def test_specs_load_from_files_and_modules(model_file):
    model = build_model_from_spec(f"{model_file}:build", "cpu")
    assert isinstance(model, SchemaModel) and check_model(model).loss is not None
    assert load_model_factory("workbench.models:build_model").__name__ == "build_model"
    assert user_model_spec("large-rnnt") is None and user_model_spec("m:f") == "m:f"
    assert user_model_spec("hf-whisper") == "workbench.adapters.huggingface:whisper"


@pytest.mark.parametrize("suffix, needle", [
    ("{file}", "expected MODULE:CALLABLE"),
    ("{dir}/nope.py:build", "nope.py: no such file"),
    ("{file}:missing", "has no attribute 'missing'"),
    ("{file}:value", "value is a int, not a callable"),
    ("{file}:raises", r"calling raises\(\) raised OSError: weights not found"),
    ("{file}:not_a_model", "returned a int, not a torch.nn.Module"),
    ("{file}:no_methods", "Linear has no method 'make_batch'"),
    ("no_such_module_xyz:build", "no module named 'no_such_module_xyz'"),
])
def test_bad_specs_get_one_line(model_file, suffix, needle):
    spec = suffix.format(file=model_file, dir=model_file.parent)
    with pytest.raises(ModelContractError, match=needle) as e:
        build_model_from_spec(spec, "cpu")
    assert "\n" not in str(e.value)


def test_a_missing_dependency_is_named_not_the_module(tmp_path, monkeypatch):
    (tmp_path / "my_models_pkg.py").write_text("import my_models_pkg_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelContractError, match="importing my_models_pkg failed: ModuleNotFoundError: .*"
                                                 "my_models_pkg_dependency_xyz"):
        load_model_factory("my_models_pkg:build")


def test_a_file_runs_once_and_its_factory_imports_its_neighbours(tmp_path):
    (tmp_path / "net_parts.py").write_text("WIDTH = 3\n")
    (tmp_path / "counted.py").write_text(
        "import builtins\nbuiltins.counted_imports = getattr(builtins, 'counted_imports', 0) + 1\n"
        "def build():\n    from net_parts import WIDTH\n    return WIDTH\n")
    import builtins

    assert load_model_factory(f"{tmp_path}/counted.py:build")() == 3
    assert load_model_factory(f"{tmp_path}/counted.py:build")() == 3
    assert builtins.counted_imports == 1


def test_a_key_error_inside_the_model_is_not_blamed_on_the_batch():
    model = tiny_schema_model()
    model.loss_fn = lambda module, batch: {"a": 1}["missing_config_key"]
    with pytest.raises(ModelContractError, match="training_step raised KeyError: 'missing_config_key'"):
        check_model(model)


def test_a_file_that_fails_to_import_is_named(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nraise ImportError('needs a newer transformers')\n")
    with pytest.raises(ModelContractError, match="importing .*bad.py raised ImportError: needs a newer"):
        load_model_factory(f"{bad}:build")


def test_schema_model_refuses_a_dtype_it_does_not_train_in():
    model = tiny_schema_model()
    with pytest.raises(ValueError, match="dtype: expected torch.float32 or torch.bfloat16, got torch.float16"):
        model.training_step(model.make_batch(2, 1.0, 3, "cpu"), dtype=torch.float16)


def test_build_adapter_names_what_it_cannot_build():
    from workbench.adapters import build_adapter

    with pytest.raises(ValueError, match="hf-whisperx: not an adapter"):
        build_adapter("hf-whisperx")
    with pytest.raises(ValueError, match="torchaudio-emformer-rnnt: has no small config"):
        build_adapter("torchaudio-emformer-rnnt", small=True)
