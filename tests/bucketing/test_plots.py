import importlib.util

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from bucketing_helpers import corpus  # noqa: E402
from workbench.bucketing import estimate_2d_bins, estimate_duration_bins, padding_comparison  # noqa: E402
from workbench.bucketing.plots import (duration_histogram, interactive_panel, padding_bars,  # noqa: E402
                                       tokens_vs_duration, tps_histograms)


def test_plots_draw_every_bin():
    d, t = corpus(3000, seed=9)
    bins = estimate_duration_bins(d, 8)
    est = estimate_2d_bins(d, t, 8, 3)
    fig = duration_histogram(d, bins)
    assert len(fig.axes[0].lines) == len(bins)
    fig2 = tokens_vs_duration(d, t, est)
    rects = [p for p in fig2.axes[0].patches if isinstance(p, Rectangle)]
    assert len(rects) == len(est.bins)
    assert max(r.get_x() + r.get_width() for r in rects) == est.bins[-1][0]
    fig3 = tps_histograms(d, t, est, max_panels=4)
    assert sum(ax.axison for ax in fig3.axes) == 4
    assert fig3._suptitle.get_text().endswith(f"(4 of {len(est.groups)} duration groups, evenly spaced)")
    assert "all 8 duration groups" in tps_histograms(d, t, est, max_panels=30)._suptitle.get_text()
    table = padding_comparison(d, t, {"none": None, "1D": bins, "2D": (est.bins, est.max_tps)})
    fig4 = padding_bars(table)
    assert len(fig4.axes[0].patches) == 2 * len(table)
    plt.close("all")


def test_interactive_panel_builds():
    d, t = corpus(500, seed=1)
    panel = interactive_panel(d, t, num_buckets=4)
    if importlib.util.find_spec("ipywidgets") is None:
        assert panel is None  # widgets are optional
    else:  # installed: three sliders at the values given, and the output
        assert [c.value for c in panel.children[:3]] == [4, 2, 4.0] and len(panel.children) == 4
    plt.close("all")
