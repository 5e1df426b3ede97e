"""The gpu tests' times by file, from the lines gpu_run.sh's tests stage leaves, and their packing into calls."""

import os
import subprocess
import sys

import pytest

from benchmarks import gpu_test_times


def phases(node: str, *seconds: float, outcome: str = "passed") -> str:
    """The lines of a test that started and ran ``seconds`` of setup, call and teardown (as many as given)."""
    return f"{node}\tstart\t0.000\t-\n" + "".join(
        f"{node}\t{phase}\t{s}\t{outcome}\n" for phase, s in zip(("setup", "call", "teardown"), seconds))


TIMES = (phases("tests/models/test_a.py::test_one", 0.5, 30.0, 0.0)
         + phases("tests/models/test_a.py::test_two[x]", 0.0, 9.5, 0.0, outcome="failed")
         + phases("tests/decoding/test_b.py::TestGraphs::test_three", 1.0, 99.0, 0.0)
         + phases("tests/test_c.py::test_four", 70.0, 0.0, 0.0, outcome="skipped"))


def test_times_are_summed_by_file_and_a_file_timed_twice_keeps_its_longest(tmp_path):
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text(TIMES)
    second.write_text(TIMES.replace("\t99.0\t", "\t119.0\t").replace("\t70.0\t", "\t10.0\t"))
    times = gpu_test_times.file_times([first, second])
    assert times.seconds == {"tests/models/test_a.py": 40.0, "tests/decoding/test_b.py": 120.0, "tests/test_c.py": 70.0}
    assert times.cut == {}


def test_a_file_cut_while_its_test_ran_is_no_whole_time_unless_another_run_timed_it(tmp_path):
    cut = tmp_path / "cut.tsv"
    cut.write_text(TIMES + phases("tests/test_d.py::test_five", 2.0)  # killed in its call
                   + phases("tests/test_c.py::test_six")  # killed in its setup: started, no phase ended
                   + "tests/test_e.py::test_seven\tstart\t0.000\t-\n"
                   + "tests/test_e.py::test_seven\t???\t0.000\tfailed\n")  # xdist's report of a crashed worker
    times = gpu_test_times.file_times([cut])
    assert times.cut == {"tests/test_d.py": 2.0, "tests/test_c.py": 70.0, "tests/test_e.py": 0.0}
    assert not {"tests/test_d.py", "tests/test_c.py", "tests/test_e.py"} & set(times.seconds)
    whole = tmp_path / "whole.tsv"  # test_c.py timed whole elsewhere, shorter: the longer bound stands
    whole.write_text(phases("tests/test_c.py::test_four", 1.0, 2.0, 3.0))
    times = gpu_test_times.file_times([cut, whole])
    assert times.seconds["tests/test_c.py"] == 70.0 and "tests/test_c.py" not in times.cut


def test_groups_keep_under_the_limit_and_a_slower_file_stands_alone():
    seconds = {"a.py": 250.0, "b.py": 120.0, "c.py": 100.0, "d.py": 60.0, "e.py": 30.0}
    groups = gpu_test_times.pack_groups(seconds, 200.0)
    assert sorted(f for g in groups for f in g) == sorted(seconds)
    assert groups[0] == ["a.py"]  # over the limit on its own
    assert all(sum(seconds[f] for f in g) <= 200.0 for g in groups[1:])
    assert len(groups) == 3


def test_a_pytest_run_with_the_variable_set_leaves_every_phase_of_its_tests(tmp_path):
    times = tmp_path / "times.tsv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    env["WORKBENCH_TEST_TIMES"] = str(times)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_palette.py"],
                   check=True, capture_output=True, cwd=gpu_test_times.REPO, env=env)
    rows = [line.split("\t") for line in times.read_text().splitlines()]
    assert rows and all(node.startswith("tests/test_palette.py::") for node, *_ in rows)
    nodes = {node for node, *_ in rows}
    assert {(node, phase) for node in nodes for phase in ("start", "teardown")} <= {(n, p) for n, p, *_ in rows}
    result = gpu_test_times.file_times([times])
    assert list(result.seconds) == ["tests/test_palette.py"] and result.seconds["tests/test_palette.py"] > 0


@pytest.mark.parametrize("line", ["not a time", "tests/test_c.py::t\tcall\t1.0",
                                  "tests/test_c.py::t\tcall\tnan\tpassed", "tests/test_c.py::t\tcall\t-1\tpassed",
                                  "tests/test_c.py::t\t\t1.0\tpassed"])
def test_a_line_that_is_not_a_time_is_one_line_naming_it(tmp_path, capsys, line):
    bad = tmp_path / "times.tsv"
    bad.write_text(f"tests/test_c.py::test_four\tcall\t1.0\tpassed\n{line}\n")
    assert gpu_test_times.main([str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (f"gpu test times: error: {bad}:2: not a '<node id> TAB <phase> TAB "
                                               "<seconds> TAB <outcome>' line")


def test_groups_of_no_seconds_are_refused(tmp_path, capsys):
    times = tmp_path / "times.tsv"
    times.write_text(TIMES)
    with pytest.raises(SystemExit) as stop:
        gpu_test_times.main([str(times), "--groups", "0"])
    assert stop.value.code == 2 and "--groups 0: needs a number of seconds above 0" in capsys.readouterr().err


def test_the_selection_collects_the_gpu_tests_without_the_flow(capsys):
    assert gpu_test_times.main(["--selection"]) == 0
    assert capsys.readouterr().out.splitlines() == ["-m", "gpu", "--ignore=tests/benchmarks/test_flow.py"]
    script = (gpu_test_times.REPO / "scripts/gpu_run.sh").read_text()
    stage = script[script.index("\n    tests)"):script.index("\n    tests-allocator)")]  # the tests stage
    assert "benchmarks.gpu_test_times --selection" in stage and "-m gpu" not in stage  # its one definition
    files = gpu_test_times.gpu_test_files()
    assert "tests/models/test_custom_ops.py" in files  # has gpu tests
    assert "tests/benchmarks/test_flow.py" not in files  # the flow stage runs it
    assert "tests/benchmarks/test_gpu_test_times.py" not in files  # no gpu test here


def test_no_times_and_no_selection_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_test_times.main([])
    assert stop.value.code == 2 and "give at least one test_times.tsv" in capsys.readouterr().err
