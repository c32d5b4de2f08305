"""Result tables: ``mean ± std`` cells (diverged runs counted, never averaged in) and markdown."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["format_mean_std", "markdown_table", "mean_std_table"]


def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        v = float(v)
        if math.isfinite(v):
            out.append(v)
    return out


def format_mean_std(values: Iterable[Any], *, scale: float = 100.0, digits: int = 1) -> str:
    """Formats ``mean ± std`` of the finite values (None/NaN are diverged runs, left out).

    The std is the sample standard deviation (ddof=1; 0 for one value). When some values are
    missing, ``(k/n)`` says how many of the n runs count; when all are missing, ``"diverged"``.

    Args:
      values: numbers (e.g. test accuracies as fractions), None or NaN for diverged runs.
      scale: multiplier applied first (100 turns fractions into percent).
      digits: decimals.

    Returns:
      e.g. ``"98.1 ± 0.3"``.

    Example:
      >>> format_mean_std([0.978, 0.984, 0.981])
      '98.1 ± 0.3'
      >>> format_mean_std([0.5, None, float("nan")])
      '50.0 ± 0.0 (1/3)'
      >>> format_mean_std([None])
      'diverged'
    """
    values = list(values)
    ok = [scale * v for v in _finite(values)]
    if not ok:
        return "diverged" if values else "–"
    std = float(np.std(ok, ddof=1)) if len(ok) > 1 else 0.0
    text = f"{np.mean(ok):.{digits}f} ± {std:.{digits}f}"
    return text if len(ok) == len(values) else f"{text} ({len(ok)}/{len(values)})"


def markdown_table(headers: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """Builds a GitHub markdown table.

    Args:
      headers: column names.
      rows: rows of cells (anything ``str()``-able; None is written as an empty cell).

    Returns:
      The table text (no trailing newline).

    Example:
      >>> print(markdown_table(["model", "acc"], [["mlp", "97.0 ± 0.1"]]))
      | model | acc |
      |---|---|
      | mlp | 97.0 ± 0.1 |
    """
    cell = lambda v: "" if v is None else str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "---|" * len(headers))
    for row in rows:
        row = list(row)
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells, the header has {len(headers)}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def mean_std_table(
    rows: Iterable[Mapping[str, Any]],
    *,
    index: Sequence[str],
    columns: str,
    value: str = "final_test_accuracy",
    scale: float = 100.0,
    digits: int = 1,
) -> str:
    """Pivots rows into a markdown table of ``mean ± std`` of ``value`` over the other fields.

    Args:
      rows: result rows (e.g. from :meth:`RunFolder.rows`); one per seed.
      index: fields that make the table's rows (e.g. ``("model",)``).
      columns: field whose values make the columns (e.g. ``"lr"``).
      value: the field aggregated (None/NaN = diverged, see :func:`format_mean_std`).
      scale: multiplier (100: percent).
      digits: decimals.

    Returns:
      The markdown table, rows and columns in first-seen order.

    Example:
      >>> rows = [{"model": "mlp", "lr": 0.1, "seed": s, "final_test_accuracy": a}
      ...         for s, a in enumerate([0.9, 0.92])]
      >>> print(mean_std_table(rows, index=("model",), columns="lr"))
      | model | lr=0.1 |
      |---|---|
      | mlp | 91.0 ± 1.4 |
    """
    rows = list(rows)
    cols: list[Any] = []
    table: dict[tuple[Any, ...], dict[Any, list[Any]]] = {}
    for row in rows:
        idx = tuple(row.get(k) for k in index)
        col = row.get(columns)
        if col not in cols:
            cols.append(col)
        table.setdefault(idx, {}).setdefault(col, []).append(row.get(value))
    body = [
        [*idx, *(format_mean_std(cells.get(c, []), scale=scale, digits=digits) for c in cols)]
        for idx, cells in table.items()
    ]
    return markdown_table([*index, *(f"{columns}={c}" for c in cols)], body)
