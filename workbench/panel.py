"""One helper for the notebooks' optional ipywidgets panels: controls that redraw a figure or table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import matplotlib.pyplot as plt


@dataclass(frozen=True)
class Slider:
    """A slider of :func:`widget_panel` that starts at ``value``, within [low, high] by ``step`` (integers
    when all four are)."""
    value: float
    low: float
    high: float
    step: float = 1


def widget_panel(draw: Callable[..., Any], **controls: Any) -> Any | None:
    """Show an ipywidgets panel with one control per keyword, in ``ipywidgets.interact``'s abbreviations
    (a list or dict: a dropdown; a bool: a checkbox) or a :class:`Slider`.
    Each change calls ``draw(**values)`` and shows the figures it drew and what it returned (a table, say).
    Returns the panel, or None with a printed note when ipywidgets is not installed."""
    try:  # optional dependency: ipywidgets comes with the notebooks extra
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        print("ipywidgets is not installed: no interactive panel (the static plots above show the same).")
        return None

    def shown(**values):
        result = draw(**values)
        plt.show()
        if result is not None and not isinstance(result, plt.Figure):
            display(result)

    def control(name: str, spec: Any):
        if not isinstance(spec, Slider):
            return spec
        whole = all(float(v).is_integer() for v in (spec.value, spec.low, spec.high, spec.step))
        kind = widgets.IntSlider if whole else widgets.FloatSlider
        cast = int if whole else float
        return kind(value=cast(spec.value), min=cast(spec.low), max=cast(spec.high), step=cast(spec.step),
                    description=name)

    panel = widgets.interactive(shown, **{name: control(name, spec) for name, spec in controls.items()})
    display(panel)
    return panel
