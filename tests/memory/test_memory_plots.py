"""Memory telemetry plots from per-step columns (lists or a DataFrame)."""

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from workbench.memory.plots import plot_device_allocs, plot_memory_curves  # noqa: E402
from workbench.units import GiB  # noqa: E402


def test_curves_take_lists_or_frames_and_draw_gib():
    lists = {"time_s": [0.1, 0.1], "allocated_bytes": [GiB, 2 * GiB], "reserved_bytes": [2 * GiB, 3 * GiB],
             "device_allocs": [3, 0]}
    fig = plot_memory_curves({"a": lists, "b": pd.DataFrame(lists)}, warmup_steps=1, title="t")
    ax = fig.axes[0]
    assert ax.get_title() == "t" and len(ax.lines) == 5  # two configs x (allocated, reserved) + the warm-up line
    assert list(ax.lines[0].get_ydata()) == [1.0, 2.0] and list(ax.lines[1].get_ydata()) == [2.0, 3.0]
    fig = plot_device_allocs({"a": lists, "b": lists})
    assert [a.get_title(loc="left") for a in fig.axes] == ["a", "b"]
    assert [p.get_height() for p in fig.axes[0].patches] == [3, 0]
