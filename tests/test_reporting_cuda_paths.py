"""The notebooks' GPU switch (reporting.has_cuda, gpu_section_note) with torch.cuda faked either way."""

import torch

from workbench.reporting import gpu_section_note, has_cuda


def test_gpu_sections_run_live_only_where_torch_sees_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert has_cuda() is True and gpu_section_note("decoder speed") is True
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert has_cuda() is False and gpu_section_note("decoder speed") is False
    assert capsys.readouterr().out.strip() == ("No CUDA GPU on this machine: 'decoder speed' is not run live; the "
                                               "committed GPU results are shown.")
