"""The table of benches and GPU stages (``benchmarks/stages.toml``): which library code each bench's records
measure, which reader function summarizes each record, and how each GPU stage runs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from workbench.records.results import REPO_ROOT

TABLE = REPO_ROOT / "benchmarks" / "stages.toml"


@dataclass(frozen=True)
class Bench:
    name: str  # benchmarks/<name>/ runs it; workbench/records/<name>.py reads its records
    measures: tuple[str, ...]  # library paths its records measure, besides benchmarks/<name>
    records: dict[str, str]  # record name (or prefix before "_") -> summary function of its reader


@dataclass(frozen=True)
class Stage:
    name: str  # `bash scripts/gpu_run.sh <name>`
    run: str  # `python3 -m` arguments with {results}, {budget}, {from} and {env:...} placeholders
    limit_s: int  # the stage's time limit, s
    writes: str  # the record it writes
    budget: tuple[int, int, int, int] | None = None  # margin_s, least_s, most_s (0: no cap), less_s
    nemo: bool = False  # NeMo's wheels on the stage's path
    before: str = ""  # a command run first


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11: pip ships a copy of the same parser
        from pip._vendor import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


@lru_cache(maxsize=4)
def load_table(path: Path = TABLE) -> tuple[dict[str, Bench], dict[str, Stage]]:
    """({bench name: Bench}, {stage name: Stage}) from the table; ValueError naming the entry when one is
    malformed."""
    data = _toml(path)
    benches, stages = {}, {}
    for name, entry in data.get("benches", {}).items():
        try:
            benches[name] = Bench(name, tuple(entry.get("measures", ())), dict(entry["records"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}: [benches.{name}]: {type(e).__name__}: {e}") from e
    for i, entry in enumerate(data.get("stages", [])):
        try:
            stage = Stage(**{**entry, "budget": tuple(entry["budget"]) if "budget" in entry else None})
        except TypeError as e:
            raise ValueError(f"{path}: stage {i + 1} ({entry.get('name', '?')}): {e}") from e
        if stage.name in stages:
            raise ValueError(f"{path}: stage {stage.name} appears twice")
        stages[stage.name] = stage
    return benches, stages


def bench_of_record(stem: str, benches: dict[str, Bench] | None = None) -> tuple[Bench, str] | None:
    """(the bench, its summary function name) for a record file's stem: the longest record name that equals
    the stem or is a prefix of it before "_" (``allocator_headroom15`` is an allocator record)."""
    benches = load_table()[0] if benches is None else benches
    matches = [(len(name), bench, fn) for bench in benches.values() for name, fn in bench.records.items()
               if stem == name or stem.startswith(name + "_")]
    if not matches:
        return None
    _, bench, fn = max(matches, key=lambda m: m[0])
    return bench, fn


def measured_code() -> dict[str, tuple[str, ...]]:
    """{bench: the library paths its records measure}."""
    return {name: bench.measures for name, bench in load_table()[0].items()}
