"""The gpu tests' times by file, from the lines gpu_run.sh's tests stage leaves, and their packing into calls."""

import os
import subprocess
import sys

from benchmarks import gpu_test_times

TIMES = ("tests/models/test_a.py::test_one\t0.5\tpassed\ntests/models/test_a.py::test_one\t30.0\tpassed\n"
         "tests/models/test_a.py::test_two[x]\t9.5\tfailed\ntests/decoding/test_b.py::TestGraphs::test_three\t100.0\t"
         "passed\ntests/test_c.py::test_four\t70.0\tskipped\n")


def test_times_are_summed_by_file_and_a_file_timed_twice_keeps_its_longest(tmp_path):
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text(TIMES)
    second.write_text(TIMES.replace("\t100.0\t", "\t120.0\t").replace("\t70.0\t", "\t10.0\t"))
    seconds = gpu_test_times.file_seconds([first, second])
    assert seconds == {"tests/models/test_a.py": 40.0, "tests/decoding/test_b.py": 120.0, "tests/test_c.py": 70.0}


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
    lines = times.read_text().splitlines()
    assert lines and all(line.startswith("tests/test_palette.py::") for line in lines)
    assert len(lines) % 3 == 0  # setup, call and teardown of each test
    seconds = gpu_test_times.file_seconds([times])
    assert list(seconds) == ["tests/test_palette.py"] and seconds["tests/test_palette.py"] > 0


def test_a_line_that_is_not_a_time_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "times.tsv"
    bad.write_text("tests/test_c.py::test_four\t1.0\tpassed\nnot a time\n")
    assert gpu_test_times.main([str(bad)]) == 2
    assert capsys.readouterr().out.strip() == (f"gpu test times: error: {bad}:2: not a '<node id> TAB <seconds> "
                                               "TAB <outcome>' line")
