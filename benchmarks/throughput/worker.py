"""One sampler's training run of the throughput study, in a process of its own (started by ``training.py``).

    python -m benchmarks.throughput.worker SPEC.json RESULT.json

SPEC.json: {"train_config": TrainConfig's fields, "smoke": bool}. The CUDA allocator's settings come from
the environment the parent gives, read when CUDA starts: none (training turns expandable segments on, as
any run does) or ``expandable_segments:False`` (training respects it). Each run starts with an empty device,
whatever ran before it. RESULT.json: {"summary": train()'s summary} or, when one utterance does not fit the
device alone, {"ooms": 1, "error": its first line}; and "allocator_settings", the settings in effect at
the end ("" for torch's defaults, None without CUDA), and "allocator_env", ``PYTORCH_ALLOC_CONF`` at the end
(as given, or as training's allocator set-up wrote it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    spec_path, result_path = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(spec_path).read_text())
    from benchmarks.harness import cpu_smoke_torch
    from workbench.atomic import write_text_atomically
    from workbench.memory.oom import is_oom_error
    from workbench.plain import to_plain
    from workbench.training.data import allocator_settings_in_effect
    from workbench.training.recipe import TrainConfig, train
    from workbench.training.split_batch import UtteranceOutOfMemoryError

    result: dict = {}
    with cpu_smoke_torch(spec.get("smoke", False)):
        try:
            result["summary"] = train(TrainConfig(**spec["train_config"]))
        except Exception as e:  # noqa: BLE001 - an OOM is a result (counted), anything else is a failure
            if not (is_oom_error(e) or isinstance(e, UtteranceOutOfMemoryError)):
                raise
            result.update(ooms=1, error=str(e).splitlines()[0])
    result["allocator_settings"] = allocator_settings_in_effect()
    result["allocator_env"] = os.environ.get("PYTORCH_ALLOC_CONF")
    write_text_atomically(Path(result_path), json.dumps(to_plain(result)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
