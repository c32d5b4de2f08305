"""Compare the rows of run folders that computed the same cells in different ways (the GPU
check, ``benchmarks/gpu_check.sh``).

Each folder holds a finished ``experiments`` run (``summary.json``); rows are matched on every
field that names the cell (model, stages, method, rate, seed, …), and for every pair of folders
against the first (the reference) the table gives how many rows match, whether every number is
bit-identical (every row field but the timings, and every metric record), and the largest
absolute difference of each final loss / accuracy.

Run: ``python benchmarks/_gpu_compare.py REFERENCE OTHER [OTHER ...] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from experiments.runs.groups import TIMING_FIELDS

#: row fields that are results, not the cell's name
RESULTS = ("final_", "diverged", "updates_to_target", *TIMING_FIELDS, "extended")


def _key(row: dict[str, Any]) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in row.items() if not k.startswith(RESULTS)))


def load(folder: Path) -> tuple[dict[tuple, dict[str, Any]], list[str]]:
    """``({cell key: row}, metric records without wall times)`` of a finished run folder."""
    rows = json.loads((folder / "summary.json").read_text())["rows"]
    records = []
    metrics = folder / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        rec = json.loads(line)
        rec.pop("wall_s", None)
        records.append(json.dumps(rec, sort_keys=True))
    return {_key(r): r for r in rows}, records


def compare(ref: Path, other: Path) -> dict[str, Any]:
    """How ``other``'s rows differ from ``ref``'s: matched rows, bit-identical or not, and the
    largest absolute difference per final metric."""
    a, ra = load(ref)
    b, rb = load(other)
    shared = sorted(set(a) & set(b))
    diffs: dict[str, float] = {}
    same = len(shared) == len(a) == len(b)
    for k in shared:
        for f, v in a[k].items():
            if f in TIMING_FIELDS or f not in b[k]:
                continue
            w = b[k][f]
            if v != w:
                same = False
            if f.startswith("final_") and isinstance(v, float) and isinstance(w, float):
                d = abs(v - w) if math.isfinite(v) and math.isfinite(w) else math.inf
                diffs[f] = max(diffs.get(f, 0.0), d)
    return {
        "rows": f"{len(shared)} of {len(a)}",
        "bit_identical": same and ra == rb,
        "rows_identical": same,
        "max_abs": diffs,
    }


def table(ref: Path, others: list[Path]) -> str:
    """A Markdown table: one line per folder compared with the reference."""
    lines = [
        f"Reference: `{ref.name}`.",
        "",
        "| run | rows matched | rows bit-identical | curves bit-identical "
        "| largest abs. difference per metric |",
        "|---|---|---|---|---|",
    ]
    for o in others:
        c = compare(ref, o)
        worst = ", ".join(f"{k} {v:.3g}" for k, v in sorted(c["max_abs"].items())) or "–"
        lines.append(
            f"| `{o.name}` | {c['rows']} | {'yes' if c['rows_identical'] else 'no'} | "
            f"{'yes' if c['bit_identical'] else 'no'} | {worst} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="the reference, then the others")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    found = [f for f in args.folders if (f / "summary.json").exists()]
    missing = [str(f) for f in args.folders if f not in found]
    text = table(found[0], found[1:]) if len(found) >= 2 else "fewer than two finished runs"
    if missing:
        text += "\n\nNot finished (no summary.json): " + ", ".join(missing)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
