"""The decoder-choice vocabulary: labels, the options that build a decoder, and reading a label back."""

import pytest

from workbench.decoding.methods import BY_LABEL, DecoderMethod, known_methods


def test_labels_of_each_kind():
    assert DecoderMethod("frame_looping", "off").label == "frame-looping off"
    assert DecoderMethod("label_looping", "partial").label == "label-looping partial"
    assert DecoderMethod("label_looping", "full", "triton_cudnn").label == "label-looping fused full"
    assert DecoderMethod("label_looping", "full", "triton").label == "label-looping fused+lstm full"
    assert DecoderMethod("label_looping", "full", "triton_cudnn", 16).label == "label-looping fused full window 16"
    assert DecoderMethod("label_looping", "full", blank_window=1).label == "label-looping full window 1"
    assert DecoderMethod("nemo", "off", "nemo").label == "NeMo no graphs"


def test_every_label_reads_back_as_its_method():
    methods = known_methods()
    assert len({m.label for m in methods}) == len(methods)  # no two share a label
    assert all(DecoderMethod.of_label(m.label) == m for m in methods)
    assert DecoderMethod.of_label("torchaudio RNNTBeamSearch beam 1") is None
    assert set(BY_LABEL) == {m.label for m in methods}


def test_the_fields_say_what_a_method_runs():
    fused = DecoderMethod.of_label("label-looping fused partial window 16")
    assert (fused.algorithm, fused.graph_mode, fused.kernels, fused.blank_window) == (
        "label_looping", "partial", "triton_cudnn", 16)
    assert fused.fused and fused.own_window
    assert fused.decoder_options() == {"algorithm": "label_looping", "cuda_graphs": "partial",
                                       "kernels": "triton_cudnn", "blank_window": 16}
    torch_stages = DecoderMethod.of_label("label-looping off")
    assert not torch_stages.fused and not torch_stages.own_window and torch_stages.kernels == "torch"


def test_methods_are_values():
    assert DecoderMethod("label_looping", "full") == DecoderMethod("label_looping", "full", "torch", "auto")
    with pytest.raises(AttributeError):
        DecoderMethod("label_looping", "full").kernels = "triton"  # frozen
