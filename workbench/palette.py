"""One colour per method across every chart of the project: a method keeps its colour in every notebook.

Names are matched case-insensitively after :func:`method_key` folds the spellings the records and
plots use ("2D profile", "2d", "bucketing 2D" are one method). A name with no entry gets a colour from
its position in the chart (:func:`colour` with ``fallback``), never one of the named methods' colours.
"""

from __future__ import annotations

# Hex colours, grouped by the question a chart answers. Status colours (OOM, budget line) are separate.
METHOD_COLOURS = {
    # how batches are formed
    "no bucketing": "#8c8c8c",
    "max_duration": "#8c8c8c",  # lhotse's fixed max_duration: one budget for every bucket
    "1d": "#e08214",
    "2d": "#2166ac",
    "2d equal buckets": "#67a9cf",  # the 2D profile at the 1D profile's number of buckets
    # how the OOMptimizer searches
    "predictive": "#1b9e77",
    "bisect": "#d95f02",
    # allocator settings
    "expandable segments": "#1b9e77",
    "plain segments": "#b2182b",
    # graph-mode decoding
    "graphs off": "#b2182b",
    "partial graphs": "#e08214",
    "full graph": "#2166ac",
    "frame-looping": "#8c8c8c",
    "nemo": "#4d4d4d",
    # models
    "large-rnnt": "#2166ac",
    "xl-aed": "#7570b3",
    "large-tdt": "#66a61e",
    "torchaudio-emformer-rnnt": "#e7298a",
    "hf-whisper": "#a6761d",
    "hf-wav2vec2-ctc": "#e6ab02",
    "nemo-fastconformer-rnnt": "#4d4d4d",
}
OOM_COLOUR = "#d62728"
FIT_COLOUR = "#2166ac"  # a quantity with no method: histograms, single bars
BOUNDARY_COLOUR = "#b2182b"  # bucket boundaries, limits, outliers
BUDGET_COLOUR = "#000000"
# For unnamed series (buckets in a trace, configs): none of these is a named method's colour.
SERIES_COLOURS = ("#1f78b4", "#33a02c", "#fb9a99", "#cab2d6", "#6a3d9a", "#b15928", "#a6cee3", "#b2df8a",
                  "#fdbf6f", "#ff7f00")

_SPELLINGS = {"1d profile": "1d", "2d profile": "2d", "bucketing 1d": "1d", "bucketing 2d": "2d",
              "2d profile, equal buckets": "2d equal buckets",
              "fixed": "max_duration", "max-duration": "max_duration", "off": "graphs off", "partial": "partial graphs",
              "full": "full graph", "expandable_segments:true": "expandable segments",
              "expandable_segments:false": "plain segments", "expandable": "expandable segments",
              "plain": "plain segments", "nemo 3.0.0": "nemo"}


def method_key(name: str) -> str:
    """The palette's key for a method name as records and plots spell it."""
    key = " ".join(str(name).lower().split())
    return _SPELLINGS.get(key, key)


def colour(name: str, fallback: int | None = None) -> str:
    """The method's colour; a name with no entry takes ``SERIES_COLOURS[fallback]`` (KeyError without one)."""
    key = method_key(name)
    if key in METHOD_COLOURS:
        return METHOD_COLOURS[key]
    if fallback is None:
        raise KeyError(f"no colour for method {name!r}; known: {', '.join(METHOD_COLOURS)}")
    return SERIES_COLOURS[fallback % len(SERIES_COLOURS)]
