"""The allocator record's readers: the committed records and the rounds/headroom layout."""

import json

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from workbench.records.allocator import (allocation_event_summary, allocation_events_table,  # noqa: E402
                                              blocks as allocator_blocks, describe_run, finding, meaning_of_live,
                                              meaning_of_runs, meaning_of_settings, paired_ratio_table,
                                              reference_caveats, step_time_summary, step_time_table,
                                              styled_paired_ratios, styled_step_times, summary_lines, table_lines)
from benchmarks.harness import RESULTS_DIR  # noqa: E402
from workbench.memory.plots import plot_device_allocs, plot_memory_curves  # noqa: E402
from workbench.units import GiB, MiB  # noqa: E402


def test_committed_record_gives_its_blocks_tables_and_curves():
    path = RESULTS_DIR / "allocator.json"
    record = json.loads(path.read_text())
    blocks = allocator_blocks(record)
    assert list(blocks) == [f"{h:g}" for h in record["params"]["headrooms"]]
    for block in blocks.values():
        assert block["rounds"] == record["figures"]["rounds_run"] >= 1
        table = step_time_table(block["figures"])
        assert set(table.index) == {"dynamic_plain", "dynamic_expandable", "static_plain", "static_expandable"}
        assert table.loc["static_plain", "paired time ratio vs static_plain"] == 1.0
        paired = paired_ratio_table(block["figures"])
        assert not paired.empty
        assert (paired["rounds"] == block["rounds"]).all()
        plot_memory_curves(block["series"], warmup_steps=block["warmup_steps"])


def test_rounds_record_gives_a_block_per_headroom_with_paired_ratios_and_events(monkeypatch, tmp_path, capsys):
    from test_allocator_bench import run_bench_with

    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys,
                                      args=["--rounds", "2", "--headroom", "0.08", "0.2"], dyn_exp_allocs=2)
    blocks = allocator_blocks(record)
    assert list(blocks) == ["0.08", "0.2"] and blocks["0.2"]["rounds"] == 2
    figures = blocks["0.08"]["figures"]
    paired = paired_ratio_table(figures)
    assert paired.loc["dynamic_plain/static_plain", "median"] == 1.3
    assert paired.loc["dynamic_plain/static_plain", "rounds"] == 2
    events = allocation_events_table(figures)
    assert set(events["config"]) == {"dynamic_expandable", "dynamic_plain"}  # the plain one re-allocates per shape
    mine = events[events["config"] == "dynamic_expandable"]
    assert list(mine["round"]) == [1, 1, 2, 2] and list(mine["block"]) == [1, 2, 1, 2]
    assert events["reason"].str.startswith("cache miss").all()
    assert step_time_table(figures).loc["static_plain", "rounds"] == 2
    plot_device_allocs(blocks["0.2"]["series"], warmup_steps=blocks["0.2"]["warmup_steps"])


def test_a_reference_that_oomed_is_named_beside_targets_met(monkeypatch, tmp_path, capsys):
    from test_allocator_bench import run_bench_with

    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"], static_plain_oom=True)
    figures = record["figures"]
    assert rc == 0 and figures["targets_met"]
    assert reference_caveats(figures) == ["headroom 0.08: static_plain had 4 OOM(s), so the time target uses "
                                          "dynamic_expandable/static_expandable"]
    assert summary_lines(figures)[0] == ("- rounds run: 2; targets met (caveat: headroom 0.08: static_plain had 4 "
                                         "OOM(s), so the time target uses dynamic_expandable/static_expandable)")
    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"])
    assert reference_caveats(record["figures"]) == [] and summary_lines(record["figures"])[0].endswith("targets met")


def test_every_committed_allocator_record_renders():
    for path in sorted(RESULTS_DIR.glob("allocator*.json")):
        record = json.loads(path.read_text())
        assert summary_lines(record["figures"]) and table_lines(record)[0].startswith("model: ")


def _config(ms, low, high, allocs=0.0, retries=0, ooms=0, events=()):
    seconds = {"median": ms / 1e3, "min": low / 1e3, "max": high / 1e3, "p25": low / 1e3, "p75": high / 1e3, "n": 2}
    return {"rounds": 2, "step_time_s": seconds, "median_step_s": ms / 1e3, "device_allocs_per_step": allocs,
            "device_frees_per_step": allocs, "alloc_retries": retries, "ooms": ooms, "peak_reserved_bytes": 16 * GiB,
            "settings": "expandable_segments:False", "allocation_events": list(events)}


def _event(step, allocs, retries, mib, reason, repeat=False):
    return {"round": 1, "block": 0, "pass_": 2, "index": step, "repeat": repeat, "shape": [5, 38.3, 266],
            "previous_shape": [8, 24.0, 120], "device_allocs": allocs, "device_frees": allocs,
            "alloc_retries": retries, "device_alloc_bytes": mib * MiB, "reason": reason}


OOM = "OOM: the step failed even after the allocator freed its cache"
MISS = "cache miss: no cached block fit after the previous shape; reserved grew by 28 MiB"


def _block(plain_retries=28):
    """One headroom block by hand: dynamic shapes on plain segments retry and OOM, on expandable ones not."""
    ratio = {"median": 1.009, "min": 1.005, "max": 1.013, "n": 2, "rounds": [1.013, 1.005]}
    return {"static_plain": _config(203, 202, 204), "static_expandable": _config(198, 193, 202),
            "dynamic_plain": _config(197.5, 195, 200, 2.81, plain_retries, plain_retries,
                                     [_event(1, 0, 1, 0, OOM), _event(1, 8, 1, 16, OOM, repeat=True),
                                      _event(7, 14, 0, 28, MISS)]),
            "dynamic_expandable": _config(198.2, 193, 203),
            "memory_limit_bytes": 17 * GiB, "memory_fraction": 0.12,
            "time_ratio_vs_static_plain": {"static_plain": 1.0, "static_expandable": 1.008, "dynamic_plain": 0.988,
                                           "dynamic_expandable": 1.018},
            "paired_time_ratios": {"dynamic_expandable/static_expandable": ratio},
            "time_target": {"pair": "dynamic_expandable/static_expandable", "limit": 1.05, "median": 1.009,
                            "rounds": [1.013, 1.005], "verdict": "met", "conclusive": True}}


def test_the_step_time_summary_reads_in_words_with_the_rounds_spread():
    table = step_time_summary(_block())
    assert list(table["Shapes"] + " " + table["Segments"]) == ["static plain", "static expandable", "dynamic plain",
                                                               "dynamic expandable"]
    assert "Median step (ms)" in table and "Peak reserved (GiB)" in table and not [c for c in table if "_" in c]
    assert table["Range over rounds (ms)"].tolist()[2] == "195–200"
    html = styled_step_times("0.08", _block()).to_html()
    assert "With 8% headroom (memory limit 17.0 GiB)" in html and "198" in html and "197.500" not in html
    assert "dynamic, expandable ÷ static, expandable" in styled_paired_ratios(_block()).to_html()
    assert "≤ 1.05: met" in styled_paired_ratios(_block()).to_html()


def test_allocation_events_are_counted_per_configuration_and_cause():
    summary = allocation_event_summary(_block())
    assert summary["Configuration"].tolist() == ["dynamic shapes, plain segments"] * 2
    assert summary["Cause"].tolist() == [OOM, "cache miss: no cached block fit after the previous shape"]
    assert summary["Steps"].tolist() == [2, 1] and summary["Of them a repeated shape"].tolist() == [1, 0]
    assert summary["Device allocations"].tolist() == [8, 14] and summary["MiB allocated"].tolist() == [16, 28]
    block = _block()
    block["dynamic_plain"]["allocation_events"] = []
    assert allocation_event_summary(block).empty


def test_the_meaning_of_the_runs_and_the_finding_are_sentences_from_the_figures():
    records = {"allocator": {"figures": {"headrooms": {"0.08": _block()}}},
               "allocator_headroom15": {"figures": {"headrooms": {"0.15": _block(plain_retries=0)}}}}
    text = meaning_of_runs(records)
    assert text.startswith("With 8% headroom (memory limit 17.0 GiB), dynamic shapes on plain segments had 28 "
                           "allocator retries, 28 OOMs and 2.81 device allocations per step; on expandable segments "
                           "they had 0, 0 and 0.00 and took 1.01x the time of the same steps run as static shapes on "
                           "expandable segments (paired over 2 rounds; target ≤ 1.05: met).")
    assert "With 15% headroom" in text and text.count(". ") == 1  # one sentence per headroom
    assert meaning_of_runs({}).startswith("No allocator run")
    assert finding(records["allocator"]["figures"]) == (
        "With expandable segments, dynamic shapes ran with 0 allocator retries and 0 OOMs against 28 and 28 without, "
        "at the same median step (198 ms), 8% above the largest step's peak memory")
    slow = _block()
    slow["dynamic_expandable"]["step_time_s"].update(median=0.250, min=0.240, max=0.260)
    assert "at a median step of 250 ms against 198 ms" in finding({"headrooms": {"0.08": slow}})


def test_the_run_description_names_configurations_in_words():
    record = {"params": {"model": "workbench.models large-rnnt", "dtype": "bf16", "steps": 64, "shape_source": "lhotse",
                         "blocks": "PEEP", "passes": 1},
              "figures": {"headrooms": {"0.08": _block()}, "rounds_run": 2, "failures": [],
                          "warnings": ["[headroom 0.08] static_plain: 28 OOM(s); the time target uses "
                                       "dynamic_expandable/static_expandable"]}}
    text = describe_run("allocator", record)
    assert "Each of 2 rounds is one process running the allocator blocks plain, expandable, expandable, plain" in text
    assert ("at 8% headroom, static shapes on plain segments: 28 OOM(s); the time target uses dynamic shapes on "
            "expandable segments ÷ static shapes on expandable segments") in text


def test_the_settings_and_live_sections_say_what_they_mean():
    from workbench.memory.allocator import AllocatorStatus

    preview = AllocatorStatus("set_env", "wrote", settings_before="max_split_size_mb:256",
                              settings_after="max_split_size_mb:256,expandable_segments:True", source="PYTORCH_ALLOC_CONF")
    here = AllocatorStatus("skipped", "no CUDA device: nothing to configure", skip_reason="no_cuda")
    assert meaning_of_settings(preview, here) == (
        "On a GPU machine configure_allocator keeps the user's 1 option(s) (max_split_size_mb:256) and adds "
        "expandable_segments:True, so the allocator starts with 'max_split_size_mb:256,expandable_segments:True'. "
        "On this machine it changes nothing (no CUDA device: nothing to configure).")
    assert meaning_of_live(None, 24).startswith("On a CUDA GPU this section runs 24 training steps")
    frame = pd.DataFrame({"device_allocs": [100, 3, 0], "alloc_retries": [0, 1, 0],
                          "reserved_bytes": [GiB, 2 * GiB, 2 * GiB]})
    assert meaning_of_live(frame, 3) == ("Over 3 steps with a new batch size each, the allocator made 3 device "
                                         "allocations after the first step and 1 retries; reserved memory ended at "
                                         "2.00 GiB.")
