"""One colour per method across the project's charts."""

import pytest

from workbench import palette


def test_spellings_of_one_method_share_its_colour():
    assert palette.colour("2D profile") == palette.colour("2d") == palette.colour(" 2D ")
    assert palette.colour("expandable_segments:True") == palette.colour("expandable segments")
    assert palette.colour("expandable_segments:False") == palette.colour("plain")
    assert palette.colour("max-duration") == palette.colour("max_duration")


def test_methods_compared_on_one_chart_get_distinct_colours():
    for group in (["max_duration", "1D", "2D", "2D equal buckets", "plain segments"], ["predictive", "bisect"], ["expandable", "plain"],
                  ["graphs off", "partial graphs", "full graph", "frame-looping", "NeMo"],
                  ["large-rnnt", "xl-aed", "torchaudio-emformer-rnnt", "hf-whisper", "hf-wav2vec2-ctc",
                   "nemo-fastconformer-rnnt"]):
        colours = [palette.colour(m) for m in group]
        assert len(set(colours)) == len(colours), group


def test_unnamed_series_never_take_a_method_colour():
    named = set(palette.METHOD_COLOURS.values()) | {palette.OOM_COLOUR, palette.BUDGET_COLOUR}
    assert not named & {palette.colour("bucket 3", fallback=k) for k in range(20)}
    with pytest.raises(KeyError, match="no colour for method 'bucket 3'"):
        palette.colour("bucket 3")


def test_charts_take_method_colours_from_the_palette():
    """No chart picks a cycle colour (C0, tab:blue, a tab10 colormap): those change meaning between charts."""
    import re
    from pathlib import Path

    cycle = re.compile(r"""colou?r\s*=\s*f?["'](C\d|C\{|tab:)|plt\.cm\.tab|prop_cycle""")
    package = Path(palette.__file__).parent
    found = [f"{path.relative_to(package)}:{n}" for path in package.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if cycle.search(line)]
    assert not found, f"cycle colours instead of workbench.palette: {found}"
