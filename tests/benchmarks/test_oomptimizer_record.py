"""The OOMptimizer records' readers on the committed records."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from workbench.records import oomptimizer as record  # noqa: E402
from benchmarks.harness import RESULTS_DIR  # noqa: E402


def _load(name):
    return json.loads((RESULTS_DIR / f"{name}.json").read_text())


def test_committed_one_gpu_record_gives_its_tables_figures_and_sentences():
    gpu = _load("oomptimizer")
    part = gpu["figures"]["rnnt"]
    searches = record.search_table(part).data
    assert list(searches["search"]) == ["predictive, all buckets", "predictive, compared buckets",
                                        "bisect, compared buckets"]
    assert searches["buckets"].iloc[0] == len(part["buckets"])
    assert len(record.true_max_styled(part).data) == len(part["true_max"])
    titles = [f.axes[0].get_title() for f in record.rnnt_figures(gpu)]
    assert len(set(titles)) == 3  # no two figures share a title
    n = len(part["comparison"]["bucket_indices"])
    assert titles[2].endswith(f"{n} of {len(part['buckets'])} buckets")
    assert record.search_intro(gpu).startswith(f"{part['model']}: {len(part['buckets'])} buckets")
    assert record.soak_sentence(part).startswith(f"Soak: {part['soak']['steps']} training steps")
    assert record.meaning_of_part(part).startswith("The predictive search needed")
    assert record.search_budget_bytes(gpu) == gpu["params"]["memory_fraction"] * gpu["device"]["gpu_memory_bytes"]
    plt.close("all")


def test_aed_part_comes_from_its_own_record_when_there_is_one():
    gpu, aed = _load("oomptimizer"), _load("oomptimizer_aed")
    part = record.aed_part(gpu, aed)
    assert part == aed["figures"]["aed"]
    assert list(record.size_table(part).data.columns) == ["bucket", "max duration (s)", "max tokens", "predictive",
                                                           "bisect"]
    assert record.aed_part(None, None) is None


def test_committed_ddp_run_beside_the_one_gpu_accounting_of_the_same_step():
    ddp, gpu = _load("oomptimizer_ddp"), _load(record.DDP_ONE_GPU_NAME)
    rows = record.ddp_rows(ddp, gpu)
    assert [r["1 GPU, DDP buckets accounted"] for r in rows] == gpu["figures"]["rnnt"]["ddp_accounting"]["batch_sizes"]
    assert record.meaning_of_ddp(ddp, gpu).startswith(f"On {ddp['figures']['world_size']} GPUs")


GIB = 2**30
_PRED = {"batch_sizes": [100, 40], "probes": 3, "ooms": 1, "probes_per_bucket": 1.5, "seconds": 10.0,
         "trace": [[0, 100, 90 * GIB, 88 * GIB], [1, 40, 80 * GIB, None], [1, 50, None, 95 * GIB]]}
_BIS = {"batch_sizes": [96, 40], "probes": 10, "ooms": 4, "probes_per_bucket": 5.0, "seconds": 30.0,
        "trace": [[0, 64, 1.0, None]] * 5 + [[1, 32, None, None]] * 5}
_PART = {"model": "m-rnnt", "buckets": [[3.3424375, 11.0], [39.9875, 145.0]], "predictive": _PRED, "bisect": _BIS,
         "true_max": {"0": {"bucket": [3.3424375, 11.0], "true_max": 104, "predictive": 100, "bisect": 96,
                            "predictive_below_true": 4 / 104}},
         "soak": {"steps": 60, "ooms": 0, "seconds": 35.6, "memory_fraction": 1.0, "search_memory_fraction": 0.9,
                  "peak_allocated_bytes": 89.1 * GIB, "peak_reserved_bytes": 99 * GIB, "budget_bytes": 100 * GIB}}


def test_search_intro_and_soak_sentence_read_the_record():
    rec = {"date": "2026-12-03T10:00:42+00:00", "params": {"dtype": "bf16", "memory_fraction": 0.9},
           "device": {"gpu": "NVIDIA H200", "gpu_memory_bytes": 100 * GIB}, "figures": {"rnnt": _PART}}
    assert record.search_intro(rec) == (
        "m-rnnt: 2 buckets, one per duration up to 40 s, each probe one bf16 training step, searched within "
        "90.0 GiB (90 % of one NVIDIA H200's 100.0 GiB), on 2026-12-03.")
    assert record.soak_sentence(_PART) == ("Soak: 60 training steps at the searched sizes ran in 36 s with 0 OOMs; the "
                                           "peak allocated was 89.1 GiB, 99.0 % of the search's budget.")
    assert record.soak_sentence({}) is None
    assert record.soak_sentence({"soak": {"error": "RuntimeError: OOM at step 5\ntrace"}}) == (
        "The soak at the searched sizes failed: RuntimeError: OOM at step 5")


def test_meaning_of_part_and_its_tables():
    assert record.meaning_of_part(_PART) == (
        "The predictive search needed 1.5 probes per bucket against bisection's 5.0, with 1 OOM against 5, "
        "on the same 2 buckets; at the 1 buckets probed up to their true maximum its sizes were at most "
        "3.8 % below it. 60 training steps at the searched sizes ran with no OOM.")
    assert record.meaning_of_part({"model": "m", "predictive": _PRED}) == (
        "m: the two searches were not both run, so they are not compared.")
    true_max = record.true_max_styled(_PART).to_html()
    assert "predictive below true max (%)" in true_max and ">3.8<" in true_max and ">3.3<" in true_max
    sizes = record.size_table(_PART).to_html()
    assert "max duration (s)" in sizes and ">40.0<" in sizes and ">145<" in sizes
    assert "probes per bucket" in record.search_table(_PART).to_html()


def test_ddp_table_and_meaning_set_two_gpus_beside_the_one_gpu_accounting():
    ddp = {"figures": {"model": "m", "world_size": 2, "buckets": _PART["buckets"],
                       "predictive": {"batch_sizes": [100, 40], "probes": 5}}}
    one = {"figures": {"rnnt": {"ddp_accounting": {"batch_sizes": [100, 40]}}}}
    rows = record.ddp_rows(ddp, one)
    assert [(r["2 GPUs (DDP)"], r["1 GPU, DDP buckets accounted"]) for r in rows] == [(100, 100), (40, 40)]
    assert record.meaning_of_ddp(ddp, one) == (
        "On 2 GPUs the predictive search needed 5 probes for 2 buckets (2.5 per bucket), and one GPU that accounts "
        "for DDP's gradient buckets found the same size at all 2 buckets: one GPU is enough to size a DDP run.")
    one["figures"]["rnnt"]["ddp_accounting"]["batch_sizes"] = [100, 38]
    assert record.meaning_of_ddp(ddp, one).endswith("found the same size at 1 of 2.")
    assert record.meaning_of_ddp(ddp, None).endswith("no one-GPU search with the DDP accounting to set it against.")
    assert "1 GPU" not in record.ddp_table(ddp, None).to_html()


def test_chunked_table_and_meaning():
    rows = [{"bucket": i, "duration_s": d, "tokens": t, "unchunked": u, "chunked": c,
             "chunked_over_unchunked": c / u if u else None}
            for i, (d, t, u, c) in enumerate([(3.3424375, 11, 100, 105), (3.3424375, 44, 100, 150),
                                              (39.9875, 145, 10, 25), (39.9875, 499, None, None)])]
    union = {"rows": rows, "joint_chunk_size": 16,
             "comparison": {"compared": 3, "median": 1.5, "target": 2.0}}
    assert record.meaning_of_chunked(union) == (
        "Running the joint and loss over chunks of 16 utterances raises the batch size by 1.50x at the median "
        "bucket, from 1.05x at 3.3 s / 11 tok to 2.50x at 40 s / 145 tok; 1 of 3 buckets reach the 2x target, "
        "exactly those with 145 tokens or more, where the joint's [batch, frames, tokens, vocabulary] tensor is "
        "largest.")
    html = record.chunked_styled(union).to_html()
    assert "joint over chunks of 16" in html and ">2.50<" in html and "not searched" in html
    assert record.meaning_of_chunked({**union, "comparison": {"compared": 0}}).startswith("No bucket was searched")
