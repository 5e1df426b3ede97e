"""The profile-sized rows of the models bench: the shapes of two buckets of the 2D profile that an OOMptimizer
record holds for a model, and the (shape, dtypes) every model is measured at."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.models.model import DTYPES
from workbench.records.results import RESULTS_DIR

PROFILE_RECORDS = (RESULTS_DIR / "oomptimizer.json", RESULTS_DIR / "oomptimizer_aed.json")
PROFILE_BUCKETS = (0, -1)  # bucket indices of a profile measured: its shortest and its longest bucket
PROFILE_DTYPE = "bf16"  # the dtype the OOMptimizer's profiles are searched in
# A model that no OOMptimizer record holds takes the profile shapes of a model that fits the same batches or
# fewer: large-tdt has large-rnnt's encoder and predictor and a joint 5 duration outputs wider.
STAND_INS = {"large-tdt": "large-rnnt"}


class ProfileShapeError(ValueError):
    """An OOMptimizer record that cannot give profile shapes: one line naming the file and what is wrong."""


class ModelNotInRecord(ProfileShapeError):
    """The record holds no profile for the model asked for."""


def oomptimizer_parts(figures: dict) -> list[dict]:
    """The searches an OOMptimizer record's figures hold: each part (the figures themselves in a DDP record,
    else ``figures["rnnt"]``, ``figures["aed"]``) that has a ``model``, its ``buckets`` and the profile's
    ``predictive`` batch sizes (a part that was skipped has none)."""
    candidates = [figures, *(v for v in figures.values() if isinstance(v, dict))]
    return [p for p in candidates if "model" in p and "buckets" in p
            and isinstance(p.get("predictive"), dict) and "batch_sizes" in p["predictive"]]


def read_profile_shapes(path, model: str, buckets=PROFILE_BUCKETS) -> list[dict]:
    """The shapes of ``buckets`` (indices into the record's bucket list, negative from the end) of the 2D
    profile that the OOMptimizer record at ``path`` holds for ``model``: [{"batch_size" (the profile's),
    "duration_s" and "num_tokens" (the bucket's worst case), "bucket_index", "record" (the file's name)}],
    one per distinct bucket. Raises :class:`ModelNotInRecord` when the record has no profile of the model,
    :class:`ProfileShapeError` when the file is unreadable, malformed or too short for an index."""
    path = Path(path)
    try:
        figures = json.loads(path.read_text())["figures"]
        parts = oomptimizer_parts(figures)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProfileShapeError(f"--profile-shapes {path}: not a readable OOMptimizer record "
                                f"({type(e).__name__}: {e})") from None
    part = next((p for p in parts if p["model"] == model), None)
    if part is None:
        held = ", ".join(sorted({p["model"] for p in parts})) or "none"
        raise ModelNotInRecord(f"--profile-shapes {path}: no OOMptimizer profile of model {model!r} (it holds: {held})")
    bounds, sizes = part["buckets"], part["predictive"]["batch_sizes"]
    if len(bounds) != len(sizes) or not bounds:
        raise ProfileShapeError(f"--profile-shapes {path}: {model}: {len(bounds)} buckets but {len(sizes)} batch "
                                f"sizes in predictive.batch_sizes")
    shapes, seen = [], set()
    for index in buckets:
        if not -len(bounds) <= index < len(bounds):
            raise ProfileShapeError(f"--profile-buckets {index}: {path.name} has {len(bounds)} buckets for {model}")
        i = index % len(bounds)
        if i not in seen:
            seen.add(i)
            seconds, tokens = bounds[i]
            shapes.append({"batch_size": int(sizes[i]), "duration_s": float(seconds), "num_tokens": int(round(tokens)),
                           "bucket_index": i, "record": path.name})
    return shapes


def profile_shapes_for(models, paths, buckets=PROFILE_BUCKETS, *, strict: bool) -> tuple[dict, dict]:
    """({model: shapes} from the first record in ``paths`` that holds it, {model: why it has none}).
    ``strict``: a model that no record holds raises :class:`ModelNotInRecord` (records given explicitly);
    otherwise it is only named in the second dict, unless its ``STAND_INS`` model was found: then it takes that
    model's shapes, each marked "stand_in". Any other problem with a record always raises."""
    found, missing = {}, {}
    for model in models:
        shapes, why = _first_profile_shapes(model, paths, buckets)
        if shapes is not None:
            found[model] = shapes
        elif strict and why is not None:
            raise why
        else:
            missing[model] = f"in no OOMptimizer record ({', '.join(Path(p).name for p in paths) or 'none given'})"
    for model, other in STAND_INS.items():
        if model in missing:
            shapes = found.get(other) or _first_profile_shapes(other, paths, buckets)[0]
            if shapes:
                found[model] = [{**shape, "stand_in": other} for shape in shapes]
                missing.pop(model)
    return found, missing


def _first_profile_shapes(model: str, paths, buckets) -> tuple[list[dict] | None, ModelNotInRecord | None]:
    """(``read_profile_shapes`` of the first record in ``paths`` that holds ``model``, None), else (None, the
    last record's refusal; None when no path was given)."""
    why = None
    for path in paths:
        try:
            return read_profile_shapes(path, model, buckets), None
        except ModelNotInRecord as e:
            why = e
    return None, why


def row_shapes(shapes, profile_shapes) -> list[tuple[dict, list[str]]]:
    """(shape, dtypes) to measure: each fixed (batch, seconds, tokens) in every dtype, each profile shape in
    the profile's dtype; a shape dict carries "shape_source" ("fixed" or "profile") and a profile's
    "profile_bucket" ({"record", "index"}, and "model" when the shape is another model's, see ``STAND_INS``)."""
    out = [({"batch_size": b, "duration_s": s, "num_tokens": u, "shape_source": "fixed"}, list(DTYPES))
           for b, s, u in shapes]
    out += [({"batch_size": p["batch_size"], "duration_s": p["duration_s"], "num_tokens": p["num_tokens"],
              "shape_source": "profile", "profile_bucket": {"record": p["record"], "index": p["bucket_index"],
                                                           **({"model": p["stand_in"]} if "stand_in" in p else {})}},
             [PROFILE_DTYPE]) for p in profile_shapes]
    return out

