"""Figures a reader understands: distinct stable styles, visible overlaps, notes, footer."""

import io
import math

from experiments import runs
from experiments.runs import curves_figure, method_style

NAMES = [f"method-{i}" for i in range(30)]


def _curve(scale=1.0, steps=20):
    return [
        {"step": s, "train_loss": scale / (s + 1), "test_accuracy": 1 - scale / (s + 2)}
        for s in range(1, steps + 1)
    ]


def _combo(style):
    return (style["color"], style["linestyle"], style["marker"])


def test_method_styles_distinct_for_30_names_and_stable():
    styles = [method_style(n, NAMES) for n in NAMES]
    assert len({_combo(s) for s in styles}) == 30
    assert len({(s["color"], s["linestyle"]) for s in styles}) == 30
    assert len({s["color"] for s in styles[:10]}) == 10
    assert [method_style(n, NAMES) for n in NAMES] == styles  # stable across calls
    assert method_style("method-3", [*NAMES, "method-3"]) == styles[3]  # duplicates ignored
    # the 11-method case of the user report: sgd and lc-asgd-async-bn no longer look alike
    eleven = ["sgd", "ssgd", "asgd", "dc-asgd", "dc-asgd-a", "gap-aware", "staleness-aware",
              "dana", "lc-asgd", "lc-asgd-async-bn", "nag-asgd"]  # fmt: skip
    assert len({_combo(method_style(n, eleven)) for n in eleven}) == 11
    # without a list: a deterministic hash choice; an unlisted name avoids the listed styles
    # (pinned: the same in every process, unlike Python's randomised hash())
    assert method_style("sgd") == {"color": "#9467bd", "linestyle": "--", "marker": "v"}
    assert _combo(method_style("other", NAMES)) not in {_combo(s) for s in styles}


def test_series_use_their_method_style_across_figures():
    methods = ["sgd", "asgd", "dana"]
    fig = curves_figure({"asgd (M=16)": [_curve()], "sgd": [_curve(2)]}, methods=methods)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    for label, method in (("asgd (M=16)", "asgd"), ("sgd", "sgd")):
        style = method_style(method, methods)
        assert lines[label].get_color() == style["color"]
        assert lines[label].get_linestyle() == style["linestyle"]
        assert lines[label].get_marker() == style["marker"]
    other = curves_figure({"dana": [_curve()], "asgd": [_curve(3)]}, methods=methods)
    asgd = next(li for li in other.axes[0].get_lines() if li.get_label() == "asgd")
    assert asgd.get_color() == lines["asgd (M=16)"].get_color()
    custom = curves_figure({"sgd": [_curve()]}, styles={"sgd": {"color": "k"}})
    assert custom.axes[0].get_lines()[0].get_color() == "k"


def test_identical_curves_both_stay_visible_and_are_named():
    fig = curves_figure({"asgd": [_curve()], "ssgd": [_curve()], "sgd": [_curve(2)]})
    a, b, _ = fig.axes[0].get_lines()
    assert list(a.get_ydata()) == list(b.get_ydata())
    assert b.get_zorder() > a.get_zorder() and b.get_linewidth() < a.get_linewidth()
    assert b.get_markevery() != a.get_markevery() and b.get_markersize() < a.get_markersize()
    assert (a.get_color(), a.get_marker()) != (b.get_color(), b.get_marker())
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert legend == ["asgd", "ssgd (= asgd)", "sgd"]


def test_empty_panels_say_why():
    diverged = [{"step": 1, "train_loss": None, "test_accuracy": None}]
    fig = curves_figure(
        {
            "M=4": {"asgd": [_curve()], "dc-asgd": [diverged]},
            "M=16": {"asgd": [diverged, diverged], "dc-asgd": [diverged]},
            "M=32": {"asgd": [], "dc-asgd": [[]]},
        }
    )
    notes = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    assert notes == [
        [],
        [],
        ["all runs diverged"] * 1,
        ["all runs diverged"],
        ["no runs"],
        ["no runs"],
    ]
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert legend == ["asgd", "dc-asgd: all runs diverged"]
    assert curves_figure({}).axes[0].texts[0].get_text() == "no runs"
    nan = [{"step": 1, "train_loss": math.nan, "test_accuracy": math.inf}]
    assert curves_figure({"sgd": [nan]}).axes[0].texts[0].get_text() == "all runs diverged"


def test_footer_is_drawn_small_at_the_bottom():
    footer = "digits, mlp, lr 0.1, momentum 0.9, 3 seeds, " + "gamma delays " * 30
    fig = curves_figure({"sgd": [_curve()]}, footer=footer, title="t")
    [text] = [t for t in fig.texts if t.get_gid() == "footer"]
    assert text.get_text().replace("\n", " ").split() == footer.split()
    assert text.get_fontsize() < 9 and text.get_position()[1] < 0.2
    assert len(text.get_text().splitlines()) > 1  # wrapped to the figure's width
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # constrained layout leaves room for it below the panels
    renderer = canvas.get_renderer()
    text_top = text.get_window_extent(renderer).y1
    assert all(ax.get_tightbbox(renderer).y0 >= text_top for ax in fig.axes)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"
    assert not [t for t in curves_figure({"sgd": [_curve()]}).texts if t.get_gid() == "footer"]
    assert runs.curves_figure is curves_figure


def test_figures_are_ready_to_print():
    """Legends beside the data, percentages clipped to [0, 100], readable axes, the smoke mark
    on every figure a --quick run saves (issue 21)."""
    import numpy as np
    from matplotlib.figure import Figure

    from experiments.runs.plots import SMOKE_MARK, clipped_errorbar, finish_figure

    fig = Figure()
    ax = fig.subplots()
    bars = clipped_errorbar(ax, [1, 2], [99.0, 1.0], [5.0, 5.0], label="a")
    segments = bars.lines[2][0].get_segments()
    assert [tuple(np.round(s[:, 1], 6)) for s in segments] == [(94.0, 100.0), (0.0, 6.0)]
    ax.legend()
    finish_figure(fig)
    anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
    assert anchor.x0 > 1.0 and [t.get_text() for t in ax.get_legend().get_texts()] == ["a"]
    assert not fig.texts  # not a smoke run: no mark
    finish_figure(finish_figure(fig, smoke=True), smoke=True)
    assert [t.get_text() for t in fig.texts] == [SMOKE_MARK]  # once

    curves = runs.curves_figure(
        {"sgd": [[{"step": 1, "train_loss": 1.0, "val_accuracy": 0.5}]]},
        ys=("train_loss", "val_accuracy"),
    )
    assert curves.axes[1].get_ylabel() == "validation accuracy %"
    assert curves.axes[1].lines[0].get_ydata()[0] == 50.0
    assert curves.axes[0].get_xlabel() == "update (mini-batch)"


def test_a_quick_run_marks_every_figure_it_saves(tmp_path):
    from matplotlib.figure import Figure

    from experiments.runs.plots import SMOKE_MARK

    figs = {"plot": Figure(), "other": Figure()}
    for fig in figs.values():
        fig.subplots().plot([0, 1])
    folder = runs.RunFolder("demo", {"quick": True}, out=tmp_path / "q")
    folder.record({"seed": 0}, {"final_test_accuracy": 0.5}, [])
    folder.finish("table", figs)
    assert all(SMOKE_MARK in [t.get_text() for t in f.texts] for f in figs.values())
    full = {"plot": Figure()}
    folder = runs.RunFolder("demo", {"quick": False}, out=tmp_path / "f")
    folder.record({"seed": 0}, {"final_test_accuracy": 0.5}, [])
    folder.finish("table", full)
    assert not full["plot"].texts


def test_axis_labels_name_the_metric_and_its_unit():
    assert runs.axis_label("val_accuracy") == "validation accuracy %"
    assert runs.axis_label("val_loss") == "validation loss (nats/token)"  # a language model's
    assert runs.axis_label("test_loss") == "test loss (nats/token)"
    assert runs.axis_label("some_field") == "some field"


def test_a_log_axis_labels_its_ticks_as_plain_numbers():
    """A loss between 3.2 and 3.6 on the log train-loss panel read "3.4×10⁰" (issue 51)."""
    curve = [{"step": s, "train_loss": 3.6 - 0.02 * s, "test_accuracy": 0.5} for s in range(20)]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = curves_figure({"sgd": [curve]})
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()]
    shown = [s for s in labels if s]
    assert shown and not [s for s in shown if "10^" in s or "times" in s or "×" in s], shown


def test_reference_levels_on_held_out_loss_panels() -> None:
    """A corpus's n-gram levels are drawn, named, on the validation-loss panel only (a training
    loss is not comparable with a test-split level)."""
    from experiments.runs import curves_figure

    runs_ = [[{"step": 1, "train_loss": 3.0, "val_loss": 3.1}, {"step": 2, "train_loss": 2.0,
              "val_loss": 2.2}]]  # fmt: skip
    fig = curves_figure(
        {"sync": runs_}, ys=("train_loss", "val_loss"), levels={"bigram": 2.57, "trigram": 1.97}
    )
    train_ax, val_ax = fig.axes[:2]
    assert [t.get_text() for t in val_ax.texts] == ["bigram", "trigram"]
    dotted = [ln.get_ydata()[0] for ln in val_ax.get_lines() if ln.get_linestyle() == ":"]
    assert dotted == [2.57, 1.97]
    assert not train_ax.texts
