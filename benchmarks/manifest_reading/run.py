"""Reading 1M cuts from a .jsonl.gz: workbench's reader against iterating lhotse.CutSet.from_jsonl_lazy.

    python -m benchmarks.manifest_reading [--num-cuts 1000000] [--out benchmarks/results]
    python -m benchmarks.manifest_reading --smoke --out /tmp/x      # 2000 cuts

Writes <out>/manifest_reading.json (``workbench/records/manifest_reading.py`` owns its fields). A CPU
benchmark; exit 1 when the two readers disagree.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from lhotse import CutSet
from tqdm.auto import tqdm

from benchmarks.harness import Run, bench_parser, start
from workbench.data import read_cut_arrays, write_synthetic_corpus
from workbench.records import manifest_reading as record
from workbench.timing import summarize

NUM_CUTS, SMOKE_NUM_CUTS = 1_000_000, 2000
TARGET_S = 10.0  # our reader's median on NUM_CUTS cuts


def lhotse_durations(path: Path, *, progress: bool = False) -> tuple[list[float], list[int]]:
    """Durations (s) and custom num_tokens of every cut, by iterating lhotse's lazy CutSet (the peer path)."""
    durations, tokens = [], []
    for cut in tqdm(CutSet.from_jsonl_lazy(path), desc="lhotse CutSet iteration", unit="cut", mininterval=2.0,
                    disable=not progress):
        durations.append(cut.duration)
        tokens.append(cut.custom["num_tokens"])
    return durations, tokens


def measure(run: Run, num_cuts: int, repeat: int) -> dict:
    """Seconds of ``repeat`` reads with ``read_cut_arrays`` and one lhotse iteration over a synthetic
    manifest of ``num_cuts`` cuts; a disagreement between the two is a failure of ``run``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_corpus(tmp, num_cuts, seed=0)
        ours = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            arrays = read_cut_arrays(path, progress=False)
            ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        durations, tokens = lhotse_durations(path)
        lhotse_s = time.perf_counter() - t0
        size = path.stat().st_size
    if len(durations) != len(arrays) or abs(sum(durations) - float(arrays.durations.sum())) >= 1e-3:
        run.failures.append("durations differ from lhotse's")
    if tokens != arrays.num_tokens.tolist():
        run.failures.append("token counts differ from lhotse's")
    ours_s = summarize(ours)
    return {"workbench_read_cut_arrays_s": ours_s, "lhotse_from_jsonl_lazy_s": summarize([lhotse_s]),
            "speedup_vs_lhotse": lhotse_s / ours_s["median"], "file_bytes": size,
            "cuts_per_s": num_cuts / ours_s["median"], "target_s": TARGET_S,
            "meets_target": ours_s["median"] <= TARGET_S}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--num-cuts", type=int, default=None,
                        help=f"cuts in the synthetic manifest (default {NUM_CUTS}; {SMOKE_NUM_CUTS} under --smoke)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of our reader")
    run = start(parser, argv, name=record.NAME, what="read durations and token counts of N cuts from a lhotse "
                ".jsonl.gz: workbench.data.read_cut_arrays vs iterating CutSet.from_jsonl_lazy", needs_cuda=False)
    num_cuts = run.args.num_cuts or (SMOKE_NUM_CUTS if run.smoke else NUM_CUTS)
    run.params["num_cuts"] = num_cuts
    with run.part("read"):
        run.figures.update(measure(run, num_cuts, run.args.repeat))
        print("\n".join(record.table_lines(run.figures)))
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
