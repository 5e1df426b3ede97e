"""The adapters for models nobody here wrote, at small sizes on the CPU: each passes the contract check,
honours the lengths the soak shortens, and refuses what it cannot take in one line."""

import importlib

import pytest
import torch

from workbench.adapters import ModelContractError, check_model


def _importable(name: str) -> bool:
    """False when the package is missing or fails to load (torchaudio built for another torch)."""
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - an extension built for another torch raises OSError
        return False


needs_transformers = pytest.mark.skipif(not _importable("transformers"), reason="transformers not installed "
                                        "(pip install -e .[adapters])")
needs_torchaudio = pytest.mark.skipif(not _importable("torchaudio.models"),
                                      reason="torchaudio does not import beside this torch")


@needs_transformers
def test_whisper_adapter_keeps_the_contract_and_masks_padded_labels():
    from workbench.adapters import build_adapter

    model = build_adapter("hf-whisper", small=True, vocab_size=64)
    report = check_model(model, spec="hf-whisper", bucket=(1.0, 6))
    assert report.batch_shapes["input_features"] == [2, 80, 200]  # the fixed window: 2 x 100 positions
    model.eval()  # no dropout: equal losses for equal labels
    batch = model.make_batch(2, 1.0, 6, "cpu")
    batch["token_lens"] = torch.tensor([6, 3])
    loss = model.loss_fn(model.module, batch)
    batch["tokens"][1, 3:] = 5  # past the length: must not count
    assert torch.equal(loss, model.loss_fn(model.module, batch))
    with pytest.raises(ValueError, match="at most 200 .2 s."):
        model.make_batch(2, 2.5, 6, "cpu")


@needs_transformers
def test_wav2vec2_ctc_adapter_keeps_the_contract_in_bf16():
    from workbench.adapters import build_adapter

    model = build_adapter("hf-wav2vec2-ctc", small=True, vocab_size=16)
    report = check_model(model, spec="hf-wav2vec2-ctc", bucket=(1.0, 4), dtype=torch.bfloat16)
    assert report.batch_shapes["audio"] == [2, 16000] and report.loss > 0
    batch = model.make_batch(2, 1.0, 4, "cpu")
    assert batch["tokens"].min() >= 1  # 0 is CTC's blank


@needs_transformers
def test_an_adapter_too_small_for_its_bucket_says_so():
    from workbench.adapters import build_adapter

    with pytest.raises(ModelContractError, match="make_batch.* raised ValueError: 500 tokens: this model takes at"):
        check_model(build_adapter("hf-whisper", small=True, vocab_size=64), spec="hf-whisper", bucket=(1.0, 500))


@needs_torchaudio
def test_emformer_rnnt_adapter_keeps_the_contract():
    from workbench.adapters.torchaudio_rnnt import RIGHT_CONTEXT_FRAMES, emformer_rnnt

    model = emformer_rnnt(vocab_size=32)
    report = check_model(model, spec="torchaudio-emformer-rnnt", bucket=(1.0, 5))
    assert report.batch_shapes["features"] == [2, 100 + RIGHT_CONTEXT_FRAMES, 80]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name, module", [("torchaudio-emformer-rnnt", "torchaudio.models"),
                                          ("hf-whisper", "transformers"), ("hf-wav2vec2-ctc", "transformers"),
                                          ("nemo-fastconformer-rnnt", "nemo.collections.asr")])
def test_gpu_adapters_at_full_size_pass_the_check_in_bf16(name, module):
    from workbench.adapters import ADAPTERS, build_model_from_spec

    if not _importable(module):
        pytest.skip(f"{module} does not import here")
    model = build_model_from_spec(ADAPTERS[name], "cuda")
    report = check_model(model, spec=name, bucket=(4.0, 30), batch_size=4, device="cuda", dtype=torch.bfloat16)
    assert report.parameters > 50e6 and report.loss > 0


@pytest.mark.skipif(not _importable("nemo.collections.asr"), reason="NeMo does not import here")
def test_nemo_fastconformer_rnnt_adapter_keeps_the_contract():
    from workbench.adapters.nemo import fastconformer_rnnt

    model = fastconformer_rnnt(vocab_size=128, n_layers=1, d_model=64, n_heads=2)
    report = check_model(model, spec="nemo-fastconformer-rnnt", bucket=(1.0, 6))
    assert report.batch_shapes["audio"] == [2, 16000] and report.loss > 0


@pytest.mark.skipif(not _importable("nemo.collections.asr"), reason="NeMo does not import here")
def test_nemo_adapter_gives_a_scalar_loss_after_an_oom_inside_the_fused_joint():
    from workbench.adapters.nemo import fastconformer_rnnt

    model = fastconformer_rnnt(vocab_size=128, n_layers=1, d_model=64, n_heads=2)
    loss = model.module.joint.loss
    real_forward = loss.forward
    loss.forward = lambda **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("probe past the limit"))
    batch = model.make_batch(4, 1.0, 6, torch.device("cpu"))
    with pytest.raises(torch.OutOfMemoryError):
        model.training_step(batch, dtype=torch.float32)
    assert loss.reduction is None  # what NeMo leaves behind
    loss.forward = real_forward
    assert model.training_step(batch, dtype=torch.float32).shape == ()
