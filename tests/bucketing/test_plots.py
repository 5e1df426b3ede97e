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


def test_padding_and_unfit_sentences_name_the_setups_and_reasons():
    import pandas as pd

    from workbench.bucketing.plots import padding_meaning, styled_padding, unfit_meaning

    comparison = pd.DataFrame({"buckets": [1, 30, 60], "utterances": [100, 100, 98], "unfit": [0, 0, 2],
                               "padded_input_share": [0.8, 0.06, 0.06], "padded_output_share": [0.98, 0.91, 0.46]},
                              index=pd.Index(["none", "1D", "2D"], name="setup"))
    assert padding_meaning(comparison).startswith("Against 1D bins, 2D bins cut the padded share of the output "
                                                  "tokens from 91 % to 46 %, with 6 % of the input frames padding "
                                                  "against 6 %: memory")
    comparison.loc["2D", "padded_output_share"] = 0.95
    assert "2D bins raise the padded share" in padding_meaning(comparison)
    html = styled_padding(comparison, "to the bound").to_html()
    assert "padded output tokens (%)" in html and "no bucketing" in html and "98.0" in html
    assert unfit_meaning({"too_long": 0, "tps_over_limit": 2}, 100) == (
        "The sampler would skip 2 of 100 utterances (2.0 %): 2 over the TPS limit; it counts them in "
        "sampler.unfit_report instead of training on them.")
    assert unfit_meaning({"too_long": 0}, 5).startswith("Every utterance fits")


def test_2d_meaning_names_the_widest_group():
    import numpy as np

    from workbench.bucketing import estimate_2d_bins
    from workbench.bucketing.plots import bins_2d_meaning

    durations = np.array([1.0] * 150 + [10.0] * 10)
    tokens = np.array(list(range(1, 151)) + [10] * 10)
    est = estimate_2d_bins(durations, tokens, 2, 2)
    assert [d for d, _ in est.bins] == [1.0, 1.0, 10.0, 10.0]
    text = bins_2d_meaning(est)
    assert text.startswith("4 buckets in 2 duration groups") and "(<= 1.0 s: " in text
