"""nvidia-smi's samples read into clock and power figures over the busy samples."""

from benchmarks.gpu_clocks import GpuClocks, clock_figures, parse_samples

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
    assert figures["below_90pct_clock_share"] == 1 / 3  # 1500 < 0.9 x 1980; the N/A sample counts as full
    assert figures["power_w"]["max"] == 700.1


def test_clock_figures_without_samples_or_busy_ones():
    assert clock_figures([], 500) is None
    idle = clock_figures(parse_samples("345, 1980, 70.0, 0, 40\n"), 500)
    assert idle["busy_samples"] == 0 and "sm_mhz" not in idle


def test_without_nvidia_smi_nothing_is_sampled(monkeypatch):
    monkeypatch.setattr("benchmarks.gpu_clocks.shutil.which", lambda name: None)
    with GpuClocks() as clocks:
        pass
    assert clocks.samples == [] and clocks.figures() is None
