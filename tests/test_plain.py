"""Records hold built-in types only: str subclasses (torch.__version__), numpy and torch scalars."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from workbench.bucketing import BucketProfile, load_profile, save_profile
from workbench.plain import to_plain


class VersionString(str):  # what torch.__version__ is (TorchVersion)
    pass


def test_to_plain_turns_subclasses_and_numpy_into_builtins():
    record = {"torch": VersionString("2.11.0+cu130"), "n": np.int64(3), "x": np.float32(0.5),
              "ok": np.bool_(True), "shape": (2, 3), "arr": np.arange(3), "t": torch.tensor(1.5),
              "path": Path("a/b"), 7: "seven"}
    plain = to_plain(record)
    assert type(plain["torch"]) is str and plain["torch"] == "2.11.0+cu130"
    assert type(plain["n"]) is int and type(plain["x"]) is float and plain["ok"] is True
    assert plain["shape"] == [2, 3] and plain["arr"] == [0, 1, 2] and plain["t"] == 1.5
    assert plain["path"] == "a/b" and plain["7"] == "seven"
    yaml.safe_dump(plain)  # both writers take it
    json.dumps(plain)
    with pytest.raises(yaml.representer.RepresenterError):
        yaml.safe_dump({"torch": VersionString("2.11")})  # the bug this guards against
    with pytest.raises(TypeError, match="object"):
        to_plain({"x": object()})


def test_save_profile_takes_metadata_with_torch_version_and_numpy_values(tmp_path):
    profile = BucketProfile(bucket_duration_bins=[[np.float64(2.0), np.int64(10)], [4.0, 30]],
                            bucket_batch_size=[np.int64(8), 4], max_tps=[np.float32(5.0), 7.5],
                            metadata={"torch": torch.__version__, "gpu_memory_bytes": np.int64(2**37)})
    path = save_profile(tmp_path / "p.yaml", profile)
    text = path.read_text()
    assert "!!" not in text  # no python tags
    loaded = load_profile(path)
    assert loaded.metadata["torch"] == str(torch.__version__) and loaded.bucket_batch_size == [8, 4]
    assert loaded.bucket_duration_bins == [[2.0, 10], [4.0, 30]]
