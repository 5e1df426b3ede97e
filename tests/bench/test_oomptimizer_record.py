"""The OOMptimizer records' readers on the committed records."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from workbench.bench.oomptimizer import record  # noqa: E402
from workbench.bench.results import RESULTS_DIR  # noqa: E402


def _load(name):
    return json.loads((RESULTS_DIR / f"{name}.json").read_text())


def test_committed_one_gpu_record_gives_its_tables_figures_and_lines():
    gpu = _load("oomptimizer")
    part = gpu["figures"]["rnnt"]
    tables = record.rnnt_tables(gpu)
    searches = tables["searches"]
    assert list(searches.index) == ["predictive, all buckets", "predictive, compared buckets",
                                    "bisect, compared buckets"]
    assert searches.loc["predictive, all buckets", "buckets"] == len(part["buckets"])
    assert len(tables) == 2 and len(next(iter(list(tables.values())[1:]))) == len(part["true_max"])
    titles = [f.axes[0].get_title() for f in record.rnnt_figures(gpu)]
    assert len(set(titles)) == 3  # no two figures share a title
    n = len(part["comparison"]["bucket_indices"])
    assert titles[2].endswith(f"{n} of {len(part['buckets'])} buckets")
    assert record.rnnt_lines(gpu)[0] == part["model"] and record.rnnt_lines(gpu)[1].startswith("soak:")
    assert record.search_budget_bytes(gpu) == gpu["params"]["memory_fraction"] * gpu["device"]["gpu_memory_bytes"]
    plt.close("all")


def test_aed_part_comes_from_its_own_record_when_there_is_one():
    gpu, aed = _load("oomptimizer"), _load("oomptimizer_aed")
    line, table, fig = record.aed_outputs(gpu, aed)
    assert line.startswith(aed["figures"]["aed"]["model"]) and list(table.index) == ["predictive", "bisect"]
    assert record.aed_outputs(None, None) is None
    plt.close("all")


def test_ddp_lines_set_the_two_gpu_run_beside_the_one_gpu_accounting():
    ddp, gpu = _load("oomptimizer_ddp"), _load("oomptimizer")
    lines = record.ddp_lines(ddp, gpu)
    assert lines[0].startswith(f"{ddp['figures']['model']} on {ddp['figures']['world_size']} GPUs")
    assert lines[1] == f"one GPU with DDP accounting: {gpu['figures']['rnnt']['ddp_accounting']['batch_sizes']}"
    assert record.ddp_lines(ddp, None) == lines[:1]
