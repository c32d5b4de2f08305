"""Drawing a schedule: the tick table as text and as a Gantt chart with weight versions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxstale.schedules.timeline import BACKWARD, FORWARD, IDLE, Schedule

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["render", "render_text"]


def _cell(s: Schedule, tick: int, k: int, versions: bool) -> str:
    op = int(s.table[tick, k])
    if op == IDLE:
        return "."
    b, m = int(s.table_batch[tick, k]), int(s.table_micro[tick, k])
    txt = ("F" if op == FORWARD else "B") + str(b)
    if s.num_micro > 1:
        txt += f".{m}"
    if versions:
        v = s.fwd_version[b, k] if op == FORWARD else s.bwd_version[b, k]
        txt += f"v{v}"
    return txt


def render_text(schedule: Schedule, versions: bool = False) -> str:
    """One line per stage, one column per tick: ``F3`` / ``B3`` (``F3.1``: micro-batch 1), ``.``.

    Args:
        schedule: the schedule.
        versions: append the weight version each pass sees (``F3v1``).

    Returns:
        The text, lines joined by newlines (trailing spaces stripped).

    Example:
        >>> from jaxstale.schedules import one_f_one_b
        >>> print(render_text(one_f_one_b(2, 2), versions=True))
        stage 0 | F0v0 F1v0 .    B0v0 .    B1v1
        stage 1 | .    F0v0 B0v0 F1v1 B1v1 .
    """
    s = schedule
    cells = [[_cell(s, t, k, versions) for t in range(s.num_ticks)] for k in range(s.num_stages)]
    width = max(len(c) for row in cells for c in row)
    return "\n".join(
        (f"stage {k} | " + " ".join(c.ljust(width) for c in row)).rstrip()
        for k, row in enumerate(cells)
    )


def render(schedule: Schedule, path: str | None = None, *, versions: bool = True) -> Figure:
    """Gantt chart: rows = stages (0 on top), x = ticks, boxes F (blue) / B (orange).

    Each box is labelled with its mini-batch (``.m`` micro-batch) and, with ``versions``, the
    weight version it sees (``v``).

    Args:
        schedule: the schedule.
        path: if given, save the figure there (png/pdf/svg by extension).
        versions: print the version under each box label.

    Returns:
        The matplotlib Figure.

    Example:
        >>> from jaxstale.schedules import one_f_one_b
        >>> fig = render(one_f_one_b(4, 6))
        >>> len(fig.axes)
        1
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    s = schedule
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * s.num_ticks + 1.5), 0.6 * s.num_stages + 1.2))
    colors = {FORWARD: "#6baed6", BACKWARD: "#fd8d3c"}
    for t in range(s.num_ticks):
        for k in range(s.num_stages):
            op = int(s.table[t, k])
            if op == IDLE:
                continue
            ax.broken_barh(
                [(t, 1)], (k - 0.4, 0.8), facecolors=colors[op], edgecolor="black", lw=0.5
            )
            b, m = int(s.table_batch[t, k]), int(s.table_micro[t, k])
            label = ("F" if op == FORWARD else "B") + str(b) + (f".{m}" if s.num_micro > 1 else "")
            if versions:
                v = s.fwd_version[b, k] if op == FORWARD else s.bwd_version[b, k]
                label += f"\nv{v}"
            ax.text(t + 0.5, k, label, ha="center", va="center", fontsize=6)
    ax.set_ylim(s.num_stages - 0.5, -0.5)
    ax.set_xlim(0, s.num_ticks)
    ax.set_yticks(range(s.num_stages))
    ax.set_yticklabels([f"stage {k}" for k in range(s.num_stages)])
    ax.set_xlabel("tick")
    title = f"{s.name}: N={s.num_stages}, {s.num_batches} mini-batches"
    if s.num_micro > 1:
        title += f" x {s.num_micro} micro-batches"
    ax.set_title(title + (" (v = weight version seen)" if versions else ""))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
