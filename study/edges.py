"""Which selected rates still sit at an edge of their grid: the report's "Grid edges" section.

Every sweep extends a rate grid whose winner on validation sits at its smallest or largest
value (``--extend-edges``, :func:`experiments.grids.extend_grid`) and its ``table.md`` says, per
method and setting, what that did: "now interior", or still at the edge after the extensions
(or at an edge that was not extended, where every seed diverged, or an extension an interrupted
run has yet to run). A selection still at an edge does not bracket the optimum — the arm may
do better at a rate not run — so a comparison that reads it is a bound, not a measurement, and a
reviewer needs to see it beside the verdicts.
:func:`section` lists those lines for every configuration from its committed ``table.md``
(copied with the rows), so ``--from-rows`` rebuilds it too; an extension that made the selection
interior is counted, not listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.reports import EDGE_HEAD as HEAD
from experiments.reports import EDGE_OPEN, NOW_INTERIOR

__all__ = ["HEAD", "edge_lines", "section"]


def edge_lines(table: str) -> tuple[list[str], int]:
    """The grid-edge paragraph of a ``table.md``: its lines whose selected rate is still at an
    edge (list items, without the bullet), and how many extensions made theirs interior.

    Example:
        >>> text = "\\n".join([
        ...     "**Grid edges** (...)",
        ...     "- grid extended: a: selected 1, now interior.",
        ...     "- grid extended: b: selected 0.1, **still at the edge after 2 extensions**.",
        ...     "",
        ...     "**Next block**",
        ...     "- at the edge, not extended: c (another paragraph's item)",
        ... ])
        >>> lines, interior = edge_lines(text)
        >>> lines, interior
        (['grid extended: b: selected 0.1, **still at the edge after 2 extensions**.'], 1)
    """
    out: list[str] = []
    interior = 0
    inside = False
    for line in table.splitlines():
        if line.startswith(HEAD):
            inside = True
            continue
        if not inside:
            continue
        if not line.startswith("- "):
            if line.strip():  # the paragraph ends at the next block
                inside = False
            continue
        item = line[2:].strip()
        if any(p in item for p in EDGE_OPEN):
            out.append(item)
        elif NOW_INTERIOR in item:
            interior += 1
    return out, interior


def section(rows: Path, names: Sequence[str]) -> list[str]:
    """The report's "Grid edges" lines from each configuration's ``table.md`` under ``rows``
    (``[]`` when no configuration has one)."""
    body: list[str] = []
    seen = False
    for name in names:
        path = rows / name / "table.md"
        if not path.exists():
            continue
        seen = True
        text = path.read_text()
        if HEAD not in text:
            body.append(f"- `{name}`: no rate grid (one rate for every method).")
            continue
        lines, interior = edge_lines(text)
        fixed = f"; {interior} made interior by extending the grid" if interior else ""
        if not lines:
            body.append(f"- `{name}`: every selected rate is inside its grid{fixed}.")
            continue
        body.append(f"- `{name}`: {len(lines)} selection(s) still at an edge{fixed}:")
        body += [f"  - {line}" for line in lines]
    if not seen:
        return []
    head = (
        "Where the rate selected on validation is still the smallest or largest of its grid "
        "after the grid was extended (or could not be), the optimum may lie beyond it: a "
        "comparison that reads that arm is a bound, not a measurement (from each "
        "configuration's table):"
    )
    return ["", '<a id="grid-edges"></a>', "", "## Grid edges", "", head, "", *body]
