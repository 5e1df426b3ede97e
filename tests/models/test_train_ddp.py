"""`torchrun --nproc-per-node 2 -m workbench train --device cpu`: DDP over gloo, as a user runs it."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from workbench.bucketing import BucketProfile
from workbench.training.distributed import Ranks
from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus
from workbench.training.recipe import TrainConfig, check_profile_for_run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tones")
    return write_tone_corpus(root, 16, seed=1, min_letters=3, max_letters=6), train_letter_tokenizer(root / "letters")


def _torchrun(corpus, out, *extra):
    cuts, tokenizer = corpus
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "workbench", "train", "--cuts", str(cuts), "--tokenizer", str(tokenizer), "--out", str(out),
           "--model", "tiny-ctc", "--max-duration", "2", "--num-buckets", "2", "--dtype", "fp32", "--device", "cpu",
           "--warmup-steps", "1", "--num-workers", "1", "--log-cut-ids", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def three_steps(corpus, tmp_path_factory):
    """Two ranks, 3 steps, a state saved after step 2 and at the end: both tests start from this run (each on a
    copy of its output), the one torchrun launch they share."""
    out = tmp_path_factory.mktemp("three_steps")
    done = _torchrun(corpus, out, "--steps", "3", "--save-every", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_two_ranks_draw_disjoint_batches_and_end_with_identical_weights(corpus, three_steps, tmp_path):
    tmp_path = shutil.copytree(three_steps, tmp_path, dirs_exist_ok=True)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    # DDP averaged the gradients: the ranks trained on different cuts yet hold the same weights
    assert len(summary["weights_digests"]) == 2 and len(set(summary["weights_digests"])) == 1
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2]
    seen = [cut for r in log for rank_ids in r["cut_ids"] for cut in rank_ids]
    assert all(len(r["cut_ids"]) == 2 and r["cut_ids"][0] and r["cut_ids"][1] for r in log)
    assert len(seen) == len(set(seen))  # no cut was drawn by both ranks (nor twice) in this epoch

    # ... and a resume on one process names the world size in one line
    cuts, tokenizer = corpus
    one = subprocess.run([sys.executable, "-m", "workbench", "train", "--cuts", str(cuts), "--tokenizer",
                          str(tokenizer), "--out", str(tmp_path), "--model", "tiny-ctc", "--max-duration", "2",
                          "--num-buckets", "2", "--dtype", "fp32", "--device", "cpu", "--warmup-steps", "1",
                          "--steps", "3", "--resume"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 2 and "saved by 2 process(es), this run has 1" in one.stderr
    assert "Traceback" not in one.stderr


def test_two_ranks_resume_each_where_its_sampler_stood(corpus, three_steps, tmp_path):
    # 16 cuts of 0.5-1 s in batches of <= 2 s: about 3 batches per rank per epoch, so steps 3-5 of the
    # resumed run cross into the next epoch. The schedule differs (it ends at --steps), the batches may not.
    straight = _torchrun(corpus, tmp_path / "straight", "--steps", "6")
    shutil.copytree(three_steps, tmp_path / "split")  # 3 steps, the state saved at their end
    resumed = _torchrun(corpus, tmp_path / "split", "--steps", "6", "--save-every", "3", "--resume")
    for done in (straight, resumed):
        assert done.returncode == 0, done.stderr[-3000:]
    logs = {name: [json.loads(line) for line in (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
            for name in ("straight", "split")}
    assert [r["step"] for r in logs["split"]] == list(range(6))
    assert [r["cut_ids"] for r in logs["split"]] == [r["cut_ids"] for r in logs["straight"]]
    summary = json.loads((tmp_path / "split" / "train_summary.json").read_text())
    assert len(set(summary["weights_digests"])) == 1
    # the totals sum each rank's own steps, restored ones included: both runs saw the same audio
    unbroken = json.loads((tmp_path / "straight" / "train_summary.json").read_text())
    assert summary["audio_seconds_per_second"] > 0 and unbroken["audio_seconds_per_second"] > 0
    assert summary["audio_seconds"] == pytest.approx(unbroken["audio_seconds"])


def _config(**kw):
    return TrainConfig(cuts="c.jsonl", tokenizer="t.model", out_dir="out", model="large-rnnt", dtype="bf16", **kw)


def test_profile_checks_name_the_field_that_does_not_match_the_run():
    profile = BucketProfile([2.0, 4.0], [8, 4], metadata={"model": "large-aed", "dtype": "bfloat16", "ddp": False,
                                                          "world_size": 1})
    warnings = check_profile_for_run(profile, "p.yaml", _config(), Ranks(), torch.device("cpu"))
    assert warnings == ["--profile p.yaml: metadata.model is 'large-aed' but this run has 'large-rnnt'; its "
                        "batch sizes may not fit"]
    with pytest.raises(ValueError, match=r"metadata.ddp is false.*oomptimize --ddp.*--nproc 2"):
        check_profile_for_run(profile, "p.yaml", _config(), Ranks(0, 2, 0), torch.device("cpu"))
    ddp_profile = BucketProfile([2.0, 4.0], [8, 4], metadata={"model": "large-rnnt", "ddp": True, "world_size": 4})
    assert check_profile_for_run(ddp_profile, "p.yaml", _config(), Ranks(1, 2, 1), torch.device("cpu")) == [
        "--profile p.yaml: metadata.world_size is 4 but this run has 2 processes"]
    with pytest.raises(ValueError, match="no 'bucket_batch_size'"):
        check_profile_for_run(BucketProfile([2.0]), "p.yaml", _config(), Ranks(), torch.device("cpu"))
