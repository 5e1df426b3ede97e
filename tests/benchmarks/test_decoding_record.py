"""The decoding record's readers compute every ratio from the record."""

import json

import matplotlib

matplotlib.use("Agg")

from workbench.records import decoding as plots  # noqa: E402
from benchmarks.decoding.targets import add_nemo_speedups, nemo_targets_of  # noqa: E402
from benchmarks.harness import RESULTS_DIR  # noqa: E402


def _plain_record(ours_rnnt, ours_tdt, speedup):
    """A record of the bench without --nemo: targets against frame-looping, no NeMo rows."""
    return {"git_commit": "0123456789", "figures": {
        "rows": [], "failures": [], "skipped_for_time": [],
        "empty_while_iteration": {"seconds_per_iteration": 1e-6},
        "targets": {"target_method": "label-looping full", "rnnt_full_s": ours_rnnt, "tdt_full_s": ours_tdt,
                    "full_speedup_vs_frame_looping_off_rnnt": speedup, "goal": "the goal"}}}


def test_a_record_without_nemo_rows_renders_without_nemo():
    record = _plain_record(0.025, 0.04, 16.0)
    line = plots.frame_looping_speedup_line(record)
    assert "16.0x faster" in line and "the goal" in line and "NeMo" not in line
    assert "not measured" in plots.frame_looping_speedup_line(_plain_record(None, None, None))
    assert plots.nemo_comparison_table(record).empty and not plots.has_nemo_rows(record)
    summary = plots.summary_lines(record["figures"])
    assert summary[0] == ("- B=16, 12 s, fp32: RNN-T label-looping full 25.00 ms, TDT label-looping full 40.00 ms; "
                          "RNN-T label-looping full 16.00x faster than frame-looping off")
    assert not any("NeMo" in s for s in summary)
    assert "NeMo" not in plots.describe_targets("decoding", record)


def _row(model, batch, method, ms):
    t = {"median": ms / 1e3, "p25": ms / 1e3, "p75": ms / 1e3}
    return {"model": model, "dtype": "float32", "batch": batch, "audio_seconds": 12.0, "method": method, "time_s": t,
            "audio_s_per_s": batch * 12.0 / t["median"]}


def test_speed_pivot_puts_batch_sizes_in_columns_at_three_significant_digits():
    rows = [_row("rnnt", 1, "label-looping off", 1.23456), _row("rnnt", 16, "label-looping off", 12.3456),
            _row("rnnt", 1, "frame-looping off", 98765.4), _row("tdt", 16, "label-looping off", 0.0123456)]
    pivot = plots.speed_pivot(plots.speed_table({"figures": {"rows": rows}}))
    assert list(pivot.columns) == ["B=1", "B=16"]
    assert pivot.loc[("rnnt", "float32", 12.0, "label-looping off")].tolist() == [1.23, 12.3]
    assert pivot.loc[("rnnt", "float32", 12.0, "frame-looping off"), "B=1"] == 98800.0
    assert pivot.loc[("tdt", "float32", 12.0, "label-looping off"), "B=16"] == 0.0123
    assert pivot.loc[("tdt", "float32", 12.0, "label-looping off"), "B=1"] != pivot.loc[
        ("tdt", "float32", 12.0, "label-looping off"), "B=1"]  # not measured: NaN
    # frame-looping sorts before label-looping (METHOD_ORDER), not alphabetically by accident
    assert [m for model, _, _, m in pivot.index if model == "rnnt"] == ["frame-looping off", "label-looping off"]


FUSED_FULL = "label-looping fused full"


def _nemo_record(target_method="label-looping full"):
    """Ours and NeMo on NeMo's modules: full graph and eager at B in {1, 16}, and the fused full graph at half the
    torch stages' time; NeMo's full graph failed at B=16, 12 s in bf16 (no row: ours is compared with its
    partial graphs there)."""
    rows = []
    for b, ours_full, nemo_full, ours_off, nemo_off in ((1, 5.0, 20.0, 50.0, 100.0), (16, 10.0, 25.0, 80.0, 160.0)):
        rows += [_row("rnnt", b, "label-looping off", ours_off), _row("rnnt", b, "NeMo no graphs", nemo_off),
                 _row("rnnt", b, "label-looping full", ours_full), _row("rnnt", b, FUSED_FULL, ours_full / 2),
                 _row("rnnt", b, "NeMo full graph", nemo_full)]
    rows += [dict(_row("rnnt", 16, "label-looping full", 12.0), dtype="bfloat16"),
             dict(_row("rnnt", 16, FUSED_FULL, 6.0), dtype="bfloat16", nemo_full_graph="failed"),
             dict(_row("rnnt", 16, "NeMo partial graphs", 30.0), dtype="bfloat16")]
    for r in rows:
        r.update(frames=150, labels_per_frame=0.3, equal_to_reference=True, reference_method=FUSED_FULL)
        r["time_s"].update(min=r["time_s"]["median"], max=r["time_s"]["median"], n=3)
    add_nemo_speedups(rows)
    failures = []
    targets = nemo_targets_of(rows, failures, smoke=False, target_method=target_method)
    return {"git_commit": "abcdef0123", "figures": {
        "rows": rows, "targets": targets, "failures": failures, "skipped_for_time": [],
        "empty_while_iteration": {"seconds_per_iteration": 4e-6},
        "peer": {"name": "NeMo", "version": "3.0.0", "decoders": "its greedy decoders", "modules": "its modules"}}}


def test_a_nemo_record_shows_ours_against_nemo_in_words():
    record = _nemo_record()
    table = plots.readable_speed_table(record)
    assert list(table.columns) == ["B=1", "B=16"]
    assert table.loc[("rnnt", "float32", "12 s", "label-looping full"), "B=1"] == "5 ms, 4.00x faster than NeMo full graph"
    assert table.loc[("rnnt", "float32", "12 s", "label-looping off"), "B=16"] == "80 ms, 2.00x faster than NeMo no graphs"
    assert table.loc[("rnnt", "float32", "12 s", "NeMo full graph"), "B=16"] == "25 ms"
    assert table.loc[("rnnt", "bfloat16", "12 s", "label-looping full"), "B=16"] == (
        "12 ms, 2.50x faster than NeMo partial graphs")
    assert table.loc[("rnnt", "bfloat16", "12 s", "label-looping full"), "B=1"] == ""  # not measured

    comparison = plots.nemo_comparison_table(record)
    assert comparison["ours vs NeMo"].tolist() == ["2.50x faster than NeMo partial graphs",
                                                   "4.00x faster than NeMo full graph", "2.50x faster than NeMo full graph"]
    assert comparison["met"].tolist() == [False, True, False]  # RNN-T target: 4x
    assert comparison["NeMo full graph (ms)"].isna().tolist() == [True, False, False]

    summary = plots.summary_lines(record["figures"])
    assert summary[0] == ("- B=16, 12 s, fp32: RNN-T label-looping full 10.00 ms, NeMo's 25.00 ms (2.50x faster "
                          "than NeMo)")
    assert "1 of 3 sizes meet the target" in summary[1] and "rnnt bfloat16 B=16 T=150: 2.50x" in summary[1]
    assert summary[2] == "- NeMo's fp32 hypotheses (tokens and frames) equal to ours in 4 of 4 rows"
    assert "NeMo 3.0.0 in the same run" in plots.describe_targets("decoding_nemo", record)
    assert plots.table_lines(record["figures"])[-1].startswith("empty while iteration")



def test_the_targets_judge_the_default_kernels_and_report_the_torch_stages_beside():
    record = _nemo_record(target_method=FUSED_FULL)
    t = record["figures"]["targets"]
    assert t["target_method"] == FUSED_FULL and t["full_graph_rows_vs_nemo"] == 3
    assert t["rnnt_full_s"] == 0.005 and t["speedup_vs_nemo_full_rnnt"] == 5.0  # 25 ms / 5 ms
    # fused: 8x, 5x and 5x NeMo (RNN-T target 4x): every size met; the torch stages: 4x, 2.5x, 2.5x
    assert t["speedup_vs_nemo_missed"] == [] and record["figures"]["failures"] == []
    assert t["torch_stages"]["method"] == "label-looping full"
    assert t["torch_stages"]["full_graph_rows_vs_nemo"] == 3 and len(t["torch_stages"]["speedup_vs_nemo_missed"]) == 2
    assert t["torch_stages"]["rnnt_full_s"] == 0.010
    comparison = plots.nemo_comparison_table(record)
    assert comparison["ours full graph (ms)"].tolist() == [6.0, 2.5, 5.0]
    assert comparison["ours torch stages full graph (ms)"].tolist() == [12.0, 5.0, 10.0]
    assert comparison["met"].tolist() == [True, True, True]
    summary = plots.summary_lines(record["figures"])
    assert summary[0] == ("- B=16, 12 s, fp32: RNN-T label-looping fused full 5.00 ms, NeMo's 25.00 ms (5.00x faster "
                          "than NeMo)")
    assert summary[1].startswith("- label-looping fused full against NeMo's") and "3 of 3 sizes" in summary[1]
    assert summary[2] == ("- label-looping full (the torch stages, reported, not judged): 1 of 3 sizes at the target "
                          "ratio")
    assert "the targets judge: label-looping fused full" in plots.describe_targets("decoding_nemo", record)


def test_a_first_difference_reads_as_one_line():
    diff = {"utterance": 7, "label_index": 40, "reference_token": 12, "reference_frame": 130, "token": None,
            "frame": None, "reference_labels": 42, "labels": 40, "at_frame": 130, "top2_tokens": [12, 1024],
            "top2_token_margin": 0.00012, "top2_durations": [1, 2], "top2_duration_margin": 3.5}
    assert plots.describe_difference(diff, "label-looping fused full") == (
        "utterance 7, label 40: label-looping fused full token 12 at frame 130, this row ended (42 vs 40 labels); "
        "our joint at frame 130: top-2 tokens [12, 1024], log-prob margin 0.00012, top-2 durations [1, 2], "
        "margin 3.5")
    record = _nemo_record()
    nemo_row = next(r for r in record["figures"]["rows"] if r["method"] == "NeMo full graph" and r["batch"] == 16)
    nemo_row["first_difference"] = diff
    nemo_row["reference_method"] = "label-looping off"
    lines = plots.summary_lines(record["figures"])
    assert ("  - rnnt B=16 T=150 NeMo full graph: utterance 7, label 40: label-looping off token 12 at frame 130, "
            "this row ended") in "\n".join(lines)


def test_every_committed_decoding_record_renders():
    for path in sorted(RESULTS_DIR.glob("decoding*.json")):
        record = json.loads(path.read_text())
        table = plots.speed_table(record)
        assert not plots.speed_pivot(table).empty and plots.summary_lines(record["figures"])
        assert not plots.readable_speed_table(record).empty
        plots.nemo_comparison_table(record), plots.describe_targets(path.stem, record)
        assert plots.table_lines(record["figures"])[-1].startswith("empty while iteration")


def test_summary_names_the_sizes_not_judged_against_nemo():
    from workbench.records import decoding as decoding_record

    figures = {"peer": {"name": "NeMo"}, "rows": [], "failures": [], "skipped_for_time": [],
               "empty_while_iteration": {"seconds_per_iteration": 4e-6},
               "targets": {
        "target_method": "label-looping fused full", "full_graph_rows_vs_nemo": 1, "speedup_vs_nemo_missed": [],
        "sizes_not_judged": ["tdt float32 B=64 T=150: not run (past the time for the rows run last)"],
        "nemo_fp32_rows": 1, "nemo_fp32_rows_unequal": []}}
    lines = decoding_record.summary_lines(figures)
    assert "- not judged against NeMo (no NeMo full-graph row, and it did not fail there): tdt float32 B=64 T=150: " \
           "not run (past the time for the rows run last)" in lines
    del figures["targets"]["sizes_not_judged"]  # every size judged
    assert not [line for line in decoding_record.summary_lines(figures) if "not judged" in line]


def test_speed_ratios_read_in_words_to_the_digits_they_carry():
    assert plots._times(7.14) == "7.1× faster" and plots._times(1.03) == "1.03× faster"
    assert plots._times(0.78) == "1.3× slower"


def test_the_speed_cells_put_nemo_ratios_in_brackets_in_method_order():
    record = _nemo_record()
    cells = plots.speed_cells(record, "float32")
    assert list(cells.columns) == ["batch 1", "batch 16"]
    assert cells.loc[("RNN-T", "12 s", "label-looping full"), "batch 1"] == "5 (4.0× faster)"
    assert cells.loc[("RNN-T", "12 s", "NeMo full graph"), "batch 16"] == "25"
    assert [m for _, _, m in cells.index] == ["label-looping off", "NeMo no graphs", "label-looping full",
                                              FUSED_FULL, "NeMo full graph"]
    assert cells.loc[("RNN-T", "12 s", "label-looping full"), "batch 1"] in plots.styled_speed_table(
        record, "float32").to_html()
    assert "NeMo 3.0.0's decoder in the same graph mode" in plots.styled_speed_table(record, "float32").to_html()


def test_the_nemo_comparison_and_differences_read_with_human_headers():
    record = _nemo_record()
    html = plots.styled_nemo_comparison(record).to_html()
    assert "Ours: label-looping full (ms)" in html and "NeMo full graph (ms)" in html and ">no<" in html
    assert "≥ 4×" in html and "audio_s" not in html
    row = next(r for r in record["figures"]["rows"] if r["method"] == "NeMo full graph" and r["batch"] == 16)
    row["first_difference"] = {"utterance": 7, "label_index": 40, "reference_token": 12, "reference_frame": 130,
                               "token": None, "frame": None, "reference_labels": 42, "labels": 40,
                               "top2_token_margin": 0.00012}
    table = plots.difference_table(record["figures"])
    assert table.to_dict("records") == [{
        "Model": "RNN-T", "Batch": 16, "Utterance (s)": 12.0, "Decoder": "NeMo full graph",
        "Checked against": FUSED_FULL, "Utterance": 7, "Label": 40, "Reference token": "12 at frame 130",
        "This row's token": "ended", "Top-2 log-prob margin": 0.00012}]
    assert plots.difference_table(record["figures"], "bfloat16").empty


def test_the_run_description_lists_failed_checks_one_per_line():
    record = _nemo_record()
    record["figures"]["failures"] = ["full graph below the NeMo target at 2 of 3 sizes: ['rnnt float32 B=1 "
                                     "T=150: 3.26x NeMo full graph', 'rnnt float32 B=16 T=150: 2.50x NeMo full graph']"]
    text = plots.describe_run("decoding_nemo", record)
    assert text.startswith("decoding_nemo.json: our decoders against NeMo 3.0.0's (its greedy decoders) on its "
                           "its modules, timed in the same run. The targets judge label-looping full.")
    assert text.endswith("1 check(s) failed:\n  - full graph below the NeMo target at 2 of 3 sizes: rnnt float32 "
                         "B=1 T=150: 3.26x NeMo full graph; rnnt float32 B=16 T=150: 2.50x NeMo full graph")
    record["figures"]["failures"] = []
    assert plots.describe_run("decoding_nemo", record).endswith("Every check passed.")


def test_each_section_of_the_notebook_means_a_sentence_from_the_figures():
    record = _nemo_record()
    assert plots.meaning_of_speed(record) == (
        "With CUDA graphs (label-looping full) the label-looping RNN-T decoder runs a batch of 16 12-s utterances "
        "(fp32) in 10 ms, 2.5× faster than NeMo 3.0.0's in the same run.")
    assert plots.finding(record) == plots.meaning_of_speed(record)  # no TDT ratio: the speed sentence
    old = _plain_record(0.025, 0.04, 16.0)
    assert plots.meaning_of_speed(old).endswith("in 25 ms, 16.0× faster than frame-looping without graphs.")
    assert plots.meaning_of_speed(_plain_record(None, None, None)).startswith("This record has no full-graph time")

    assert plots.meaning_of_nemo(record) == (
        "label-looping full meets its target against NeMo's full graph (RNN-T ≥ 4×, TDT ≥ 2×) at 1 of 3 sizes; it "
        "falls short at RNN-T fp32 batch 16, 12 s (2.5×); RNN-T bf16 batch 16, 12 s (2.5×). NeMo's fp32 hypotheses "
        "equal ours in 4 of 4 rows.")

    for r in record["figures"]["rows"]:
        if r["batch"] == 16 and r["dtype"] == "float32" and r["method"] in ("label-looping full", "label-looping off"):
            r["seconds_per_outer_iteration"] = r["time_s"]["median"] / 100
            r["kernels_per_outer_iteration"] = 17 if r["method"].endswith("full") else 102
    assert plots.meaning_of_iterations(record) == (
        "At batch 16 (RNN-T, 12 s, fp32) one outer iteration of label-looping full takes 100 µs against 800 µs "
        "without graphs (label-looping off), launching 17 kernels per iteration instead of 102; an empty "
        "conditional-while iteration costs 4.0 µs, 4% of it.")
    assert plots.meaning_of_iterations(_plain_record(0.025, 0.04, 16.0)).startswith("This record has no")

    live = {"figures": {"rows": [_row("rnnt", 4, "frame-looping off", 9.0), _row("rnnt", 4, "label-looping off", 8.0),
                                 _row("rnnt", 4, "label-looping full", 2.0)]}}
    assert plots.meaning_of_live(live, cuda=False).startswith(
        "On this CPU only the eager decoders ran (frame-looping off, label-looping off, label-looping full)")
    assert plots.meaning_of_live(live, cuda=True) == (
        "On this GPU the tiny RNN-T decoder's full graph takes 2 ms at batch 4 against 8 ms without graphs "
        "(4.0× faster).")


def test_a_method_is_drawn_in_its_graph_modes_colour_and_the_charts_keep_the_legend_off_the_data():
    from workbench.palette import colour

    assert plots.method_style("label-looping fused partial")["color"] == colour("partial graphs")
    assert plots.method_style("label-looping fused partial")["hatch"] == "//"
    nemo = plots.method_style("NeMo no graphs")
    assert nemo["color"] == colour("NeMo") and nemo["edgecolor"] == colour("graphs off")
    assert plots.method_style("frame-looping off")["color"] == colour("frame-looping")
    table = plots.speed_table(_nemo_record())
    fig = plots.speed_bars(table)
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()][:2] == ["label-looping off", "NeMo no graphs"]
    assert legend.get_bbox_to_anchor().x0 > fig.axes[0].get_window_extent().x1  # right of the axes
    fig = plots.iteration_breakdown(table.assign(us_per_outer_iteration=table["ms"]), 4e-6)
    assert [ax.get_title() for ax in fig.axes] == ["RNN-T"] and fig.legends


def test_committed_speed_record_prefers_the_fullest_run_and_the_nemo_record_follows_it(tmp_path, capsys):
    def save(name, record):
        (tmp_path / f"{name}.json").write_text(json.dumps({"name": name, **record}))

    assert plots.committed_speed_record(tmp_path) is None
    assert "No committed decoding result yet" in capsys.readouterr().out
    save("decoding_quick", _plain_record(0.02, 0.03, 10.0))
    assert plots.committed_speed_record(tmp_path)["name"] == "decoding_quick"
    save("decoding", _plain_record(0.02, 0.03, 12.0))
    plain = plots.committed_speed_record(tmp_path)
    assert plain["name"] == "decoding"
    assert plots.committed_nemo_record(plain, tmp_path) is None  # no NeMo rows, no quick comparison
    save("decoding_nemo_quick", _nemo_record())
    assert plots.committed_nemo_record(plain, tmp_path)["name"] == "decoding_nemo_quick"
    save("decoding_nemo", _nemo_record())
    beside_nemo = plots.committed_speed_record(tmp_path)
    assert beside_nemo["name"] == "decoding_nemo" and plots.committed_nemo_record(beside_nemo, tmp_path) is beside_nemo
