"""nvidia-smi's samples read into clock and power figures over the busy samples."""

import os
import stat
import time

from benchmarks.gpu_clocks import GpuClocks, clock_figures, parse_samples, visible_card

CSV = """1980, 1980, 650.5, 99, 61
1500, 1980, 700.1, 98, 70
345, 1980, 70.0, 0, 40
[N/A], 1980, 500.0, 80, 60
garbage line
"""


def test_parse_samples_keeps_numbers_and_skips_bad_lines():
    samples = parse_samples(CSV)
    assert len(samples) == 4
    assert samples[0] == {"sm_mhz": 1980.0, "max_sm_mhz": 1980.0, "power_w": 650.5, "utilization_pct": 99.0,
                          "temperature_c": 61.0}
    assert "sm_mhz" not in samples[3] and samples[3]["power_w"] == 500.0


def test_clock_figures_count_only_busy_samples():
    figures = clock_figures(parse_samples(CSV), 500)
    assert figures["samples"] == 4 and figures["busy_samples"] == 3
    assert figures["sm_mhz"]["min"] == 1500.0 and figures["sm_mhz"]["n"] == 2  # the idle 345 MHz is left out
    assert figures["power_w"]["max"] == 700.1 and figures["power_w"]["n"] == 3


def test_clock_figures_without_samples_or_busy_ones():
    assert clock_figures([], 500) is None
    idle = clock_figures(parse_samples("345, 1980, 70.0, 0, 40\n"), 500)
    assert idle["busy_samples"] == 0 and "sm_mhz" not in idle


def test_the_card_sampled_is_the_first_visible_one(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_card() == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert visible_card() == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c")
    assert visible_card() == "GPU-8f1c"


def test_without_nvidia_smi_nothing_is_sampled(monkeypatch):
    monkeypatch.setattr("benchmarks.gpu_clocks.shutil.which", lambda name: None)
    with GpuClocks() as clocks:
        pass
    assert clocks.samples == [] and clocks.figures() is None


def test_samples_come_from_nvidia_smi_on_the_visible_card_until_the_block_ends(tmp_path, monkeypatch):
    # a stand-in nvidia-smi: notes its arguments, prints a sample every 50 ms until Ctrl-C (SIGINT)
    args_file = tmp_path / "args"
    script = tmp_path / "nvidia-smi"
    script.write_text(f"""#!/usr/bin/env bash
echo "$@" > {args_file}
trap 'echo "1400, 1980, 640.0, 97, 66"; exit 0' INT
while true; do echo "1980, 1980, 650.0, 99, 60"; sleep 0.05; done
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with GpuClocks(period_ms=50) as clocks:
        time.sleep(0.5)
    assert args_file.read_text().split() == ["-i", "2", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,"
                                             "utilization.gpu,temperature.gpu", "--format=csv,noheader,nounits",
                                             "--loop-ms=50"]
    assert len(clocks.samples) >= 3 and clocks.samples[-1]["sm_mhz"] == 1400.0  # the line written on Ctrl-C kept
    figures = clocks.figures()
    assert figures["busy_samples"] == len(clocks.samples) and figures["sm_mhz"]["min"] == 1400.0
