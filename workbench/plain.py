"""to_plain: any record (profile metadata, bench results, logs) as built-in types that YAML and JSON take.

``yaml.safe_dump`` refuses subclasses of ``str``/``int``/``float`` (``torch.__version__`` is one) and
numpy scalars; ``json.dumps`` refuses numpy scalars and arrays. Converting at the writer, once, makes
every record safe whatever its fields hold.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any


def to_plain(obj: Any) -> Any:
    """``obj`` with every value turned into dict/list/str/int/float/bool/None (recursively).

    Mappings keep their keys as ``str``; tuples, sets and arrays become lists; numpy and torch scalars
    become Python numbers (arrays and tensors nested lists); dataclasses become dicts; enums their value;
    paths strings. Raises TypeError naming the type of anything else."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, dict):
        return {str(to_plain(k)): to_plain(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_plain(dataclasses.asdict(obj))
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_plain(v) for v in obj]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars, torch tensors
        if getattr(obj, "ndim", 0) == 0 or _is_scalar_tensor(obj):
            return to_plain(obj.item())
        return to_plain(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):
        return to_plain(obj.item())
    raise TypeError(f"cannot write a value of type {type(obj).__module__}.{type(obj).__qualname__} "
                    f"({obj!r:.60}) to YAML or JSON")


def _is_scalar_tensor(obj: Any) -> bool:
    numel = getattr(obj, "numel", None)
    return callable(numel) and numel() == 1 and getattr(obj, "dim", lambda: 1)() == 0
