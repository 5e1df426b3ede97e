"""The README flow runner: parsing the README's block, running commands as typed, the checks, the record."""

import json
import os
from pathlib import Path

import pytest

from workbench.records import flow as flow_record
from benchmarks.flow.run import FlowError, main, readme_flow_commands, run_commands, train_commands
from workbench.bucketing import BucketProfile, save_profile
from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_flow_is_the_path_a_user_walks():
    commands = readme_flow_commands(REPO / "README.md")
    words = [c.split()[:2] for c in commands]
    assert words[:4] == [["workbench", "corpus"], ["workbench", "corpus"], ["workbench", "bins"],
                         ["workbench", "oomptimize"]]
    assert "--validate" in commands[3].split()
    trains = train_commands(commands)
    assert "--profile" in trains["train_profile"] and "--max-duration" in trains["train_max_duration"]
    assert all("\\" not in c for c in commands)  # continuations joined


def test_a_failing_command_names_itself_and_its_output(tmp_path):
    with pytest.raises(FlowError, match=r"`workbench corpus stats missing.jsonl` exited 2:(.|\n)*missing.jsonl"):
        run_commands(["workbench corpus stats missing.jsonl"], tmp_path, log=lambda *a: None)


def test_flow_on_cpu_runs_the_commands_checks_and_writes_the_record(tmp_path):
    # The GPU flow's checks, on a CPU-sized flow: a hand-made profile instead of the OOMptimizer.
    data = tmp_path / "work" / "data"
    cuts = write_tone_corpus(data, 12, seed=0, min_letters=3, max_letters=6)
    tokenizer = train_letter_tokenizer(data / "letters")
    save_profile(tmp_path / "work" / "profile.yaml",
                 BucketProfile([1.5, 10.0], [3, 2], metadata={"probes": 4, "unmerged_buckets": 2, "soak": {"ooms": 0}}))
    common = (f"--cuts {cuts} --tokenizer {tokenizer} --model tiny-rnnt --dtype fp32 --device cpu --lr 3e-3 "
              "--warmup-steps 1 --steps 8 --num-workers 1")
    readme = tmp_path / "README.md"
    readme.write_text("text\n\n<!-- flow -->\n```sh\n# a comment\n"
                      f"workbench train {common} --profile profile.yaml --out runs/profile\n"
                      f"workbench train {common} \\\n    --max-duration 4 --num-buckets 2 --out runs/max-duration\n```\n")
    assert main(["--out", str(tmp_path / "results"), "--workdir", str(tmp_path / "work"), "--readme", str(readme)]) == 0
    rec = json.loads((tmp_path / "results" / "flow.json").read_text())
    f = rec["figures"]
    assert [c["command"].split()[1] for c in f["commands"]] == ["train", "train"]
    assert f["failures"] == [] and all(f["checks"].values())
    assert f["profile"]["batch_sizes"] == [3, 2] and f["profile"]["probes_per_bucket"] == 2.0
    assert f["train_profile"]["batch_size"]["max"] <= 3 and f["train_profile"]["steps"] == 8
    assert 0 <= f["train_profile"]["data_wait_share_after_warmup"] < 1
    assert f["decode"]["utterances"] == 8 and f["decode"]["valid"]
    lines = flow_record.summary_lines(rec["figures"])
    assert lines[0].startswith("README flow: 2 commands") and "all passed" in lines[0]
    assert len(flow_record.commands_table(rec)) == 2


@pytest.mark.gpu
def test_readme_flow_on_the_gpu(tmp_path):
    # As a user types it: scripts/gpu_run.sh flow sets WORKBENCH_FLOW_OUT to keep the record.
    out = Path(os.environ.get("WORKBENCH_FLOW_OUT", tmp_path))
    assert main(["--out", str(out)]) == 0
    f = json.loads((out / "flow.json").read_text())["figures"]
    assert f["failures"] == []
    assert f["profile"]["soak_ooms"] == 0 and min(f["profile"]["batch_sizes"]) > 0


def test_readme_block_parsing_keeps_quoted_hashes_and_skips_comments_in_continuations(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- flow -->\n```sh\n# title\nworkbench corpus stats a.jsonl \\\n"
                      "    # a note inside the continuation\n    --tokenizer t.model\n\n"
                      'echo "a #b"\n```\nafter\n')
    assert readme_flow_commands(readme) == ["workbench corpus stats a.jsonl --tokenizer t.model", 'echo "a #b"']


def test_a_failed_command_is_recorded_and_summarized(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- flow -->\n```sh\ntrue\nfalse\necho never\n```\n")
    assert main(["--out", str(tmp_path / "results"), "--readme", str(readme)]) == 1
    f = json.loads((tmp_path / "results" / "flow.json").read_text())["figures"]
    assert [c["command"] for c in f["commands"]] == ["true"]
    assert f["failures"] == ["flow: FlowError: `false` exited 1:"]
    assert flow_record.summary_lines(f) == ["README flow: FAILED after 1 commands in 0 s: flow: FlowError: "
                                            "`false` exited 1:"]
