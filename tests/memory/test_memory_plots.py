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


def test_configs_take_their_allocator_settings_colour_and_retries_are_marked():
    from matplotlib.colors import to_hex

    from workbench.palette import OOM_COLOUR, SERIES_COLOURS, colour

    steps = {"time_s": [0.1] * 3, "allocated_bytes": [GiB] * 3, "reserved_bytes": [2 * GiB] * 3,
             "device_allocs": [3, 1, 0], "alloc_retries": [0, 1, 0]}
    fig = plot_memory_curves({"dynamic shapes, plain segments": steps, "dynamic shapes, expandable segments": steps,
                              "live": steps})
    ax = fig.axes[0]
    assert [to_hex(line.get_color()) for line in ax.lines[::2]] == [colour("plain"), colour("expandable"),
                                                                     SERIES_COLOURS[2]]
    assert ax.get_legend().get_bbox_to_anchor().y1 < ax.get_window_extent().y0  # below the axes, off the data
    fig = plot_device_allocs({"static_plain": steps, "static_expandable": {**steps, "alloc_retries": [0, 0, 0]}})
    plain, expandable = fig.axes
    assert to_hex(plain.patches[0].get_facecolor()) == colour("plain segments")
    assert to_hex(expandable.patches[0].get_facecolor()) == colour("expandable segments")
    assert [to_hex(c) for c in plain.collections[0].get_facecolors()] == [OOM_COLOUR] and not expandable.collections
