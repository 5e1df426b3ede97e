"""The notebooks' widget panel: controls built from the keywords, each change redraws."""

import importlib.util

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from workbench.panel import Slider, widget_panel  # noqa: E402


@pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is None, reason="ipywidgets is optional")
def test_each_change_calls_draw_with_the_controls_values():
    calls = []
    panel = widget_panel(lambda **v: calls.append(v), n=Slider(3, 1, 9), x=Slider(0.5, 0.0, 1.0, 0.1),
                         kind=["a", "b"], on=True)
    n, x, kind, on = panel.children[:4]
    assert (type(n).__name__, n.value, n.min, n.max) == ("IntSlider", 3, 1, 9)
    assert type(x).__name__ == "FloatSlider" and x.value == 0.5 and x.step == 0.1
    assert calls == [{"n": 3, "x": 0.5, "kind": "a", "on": True}]  # drawn once when shown
    kind.value = "b"
    n.value = 7
    assert calls[-1] == {"n": 7, "x": 0.5, "kind": "b", "on": True} and len(calls) == 3


def test_without_ipywidgets_there_is_no_panel_and_a_note(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_widgets(name, *args, **kwargs):
        if name == "ipywidgets":
            raise ImportError("no ipywidgets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_widgets)
    assert widget_panel(lambda: None) is None
    assert "ipywidgets is not installed" in capsys.readouterr().out
