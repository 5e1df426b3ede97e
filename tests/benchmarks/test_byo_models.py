"""The byo_models bench on the CPU (real steps, a modeled peak) and its record reader."""

import json

import pytest

from workbench.records import byo_models as record
from benchmarks.byo_models.run import main

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def smoke_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("byo")
    assert main(["--smoke", "--out", str(out), "--soak-steps", "1"]) == 0  # smoke: checks reported, not enforced
    return out, json.loads((out / "byo_models.json").read_text())


def test_smoke_run_measures_every_small_model(smoke_record):
    _, rec = smoke_record
    models = rec["figures"]["models"]
    assert set(models) == {"hf-whisper", "hf-wav2vec2-ctc", "large-rnnt"}  # the adapters with a small config
    for entry in models.values():
        assert "error" not in entry, entry
        assert len(entry["batch_sizes"]) == len(rec["figures"]["buckets"]) == len(entry["tightness"])
        assert all(t["oom"] for t in entry["tightness"])  # the modeled peak is exact: 1.1x never fits
        assert entry["soak"]["ooms"] == 0
        trace = entry["probes"]
        assert [sum(p["bucket"] == i for p in trace) for i in range(len(entry["batch_sizes"]))] == \
            entry["probes_per_bucket"]
        assert all((p["peak_bytes"] is None) == (p["batch_size"] > entry["batch_sizes"][p["bucket"]]) for p in trace)


def test_reader_merges_reruns_and_writes_its_lines(smoke_record, tmp_path):
    out, rec = smoke_record
    rerun = {**rec, "name": "byo_models_x", "date": "9999", "git_commit": "abcdef0" * 6,
             "figures": {**rec["figures"], "models": {"hf-whisper": {"spec": "s", "error": "RuntimeError: boom"},
                                                      "new-model": rec["figures"]["models"]["large-rnnt"]}}}
    (out / "byo_models_x.json").write_text(json.dumps(rerun))
    figures = record.committed_figures(out)
    assert figures["models"]["hf-whisper"]["commit"] == rec["git_commit"][:7]  # a measured entry beats an error
    assert figures["models"]["new-model"]["commit"] == "abcdef0"
    lines = record.summary_lines(figures)
    assert len(lines) == 4 and all(line.startswith("- ") for line in lines)
    assert record.findings(figures)[0].startswith("4 of 4 models were searched")
    rows = record.model_rows(figures)
    assert len(rows) == 4 * len(figures["buckets"]) and set(rows["1.1x OOMs"]) == {"yes"}
    with pytest.raises(ValueError, match="other buckets"):
        record.merged_figures([rec, {**rerun, "figures": {**rerun["figures"], "buckets": [[1.0, 2.0]]}}])


def test_check_meaning_says_which_adapters_keep_the_contract():
    from workbench.records.byo_models import check_meaning

    assert check_meaning({"a": object(), "b": "No module named 'transformers'"}) == (
        "a keeps the contract: one step gives a finite scalar loss and a gradient for every trainable tensor, so "
        "the OOMptimizer can probe it. Not checked: b (No module named 'transformers').")
    assert check_meaning({}) == "No adapter was checked here."



def test_check_adapters_reports_each_adapter_or_why_not(monkeypatch):
    pytest.importorskip("transformers")
    import workbench.adapters
    from workbench.records import byo_models as record

    real = workbench.adapters.build_adapter

    def build(name, device, small=False):
        if name == "hf-whisper":
            raise ImportError("No module named 'transformers'")
        return real(name, device, small=small)

    monkeypatch.setattr(workbench.adapters, "build_adapter", build)
    results = record.check_adapters(["hf-wav2vec2-ctc", "hf-whisper"], "cpu", small=True)
    assert record.check_line("hf-wav2vec2-ctc", results["hf-wav2vec2-ctc"]).startswith("ok: hf-wav2vec2-ctc: ")
    assert record.check_line("hf-whisper", results["hf-whisper"]) == (
        "hf-whisper: not checked here (No module named 'transformers'; pip install -e .[adapters])")
