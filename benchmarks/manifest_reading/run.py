"""Reading 1M cuts from a .jsonl.gz: workbench's reader against iterating lhotse.CutSet.from_jsonl_lazy.

    python -m benchmarks.manifest_reading [--num-cuts 1000000] [--out benchmarks/results]

Writes <out>/manifest_reading.json (``record.py`` owns its fields). A CPU benchmark.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lhotse import CutSet
from tqdm.auto import tqdm

from workbench.records import manifest_reading as record
from benchmarks.harness import write_result
from workbench.timing import summarize
from workbench.data import read_cut_arrays, write_synthetic_corpus


def lhotse_durations(path: Path, *, progress: bool = False) -> tuple[list[float], list[int]]:
    """Durations and custom num_tokens of every cut, by iterating lhotse's lazy CutSet (the peer path)."""
    durations, tokens = [], []
    for cut in tqdm(CutSet.from_jsonl_lazy(path), desc="lhotse CutSet iteration", unit="cut", mininterval=2.0,
                    disable=not progress):
        durations.append(cut.duration)
        tokens.append(cut.custom["num_tokens"])
    return durations, tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-cuts", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of our reader")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_corpus(tmp, args.num_cuts, seed=0)
        ours = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            arrays = read_cut_arrays(path, progress=False)
            ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        durations, tokens = lhotse_durations(path)
        lhotse_s = time.perf_counter() - t0
        assert len(durations) == len(arrays) and abs(sum(durations) - float(arrays.durations.sum())) < 1e-3
        assert tokens == arrays.num_tokens.tolist(), "token counts differ from lhotse's"
        size = path.stat().st_size
    ours_s = summarize(ours)
    figures = {"workbench_read_cut_arrays_s": ours_s, "lhotse_from_jsonl_lazy_s": summarize([lhotse_s]),
               "speedup_vs_lhotse": lhotse_s / ours_s["median"], "file_bytes": size,
               "cuts_per_s": args.num_cuts / ours_s["median"], "target_s": 10.0,
               "meets_target": ours_s["median"] <= 10.0}
    path = write_result("manifest_reading", what="read durations and token counts of N cuts from a "
                        "lhotse .jsonl.gz: workbench.data.read_cut_arrays vs iterating CutSet.from_jsonl_lazy",
                        figures=figures, params={"num_cuts": args.num_cuts, "repeat": args.repeat},
                        out_dir=args.out)
    print("\n".join(record.table_lines(figures)) + f"\nwrote {path}")


if __name__ == "__main__":
    main()
