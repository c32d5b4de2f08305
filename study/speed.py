"""How fast each arm learned, from its test curve: a speed reading beside the verdicts.

A claim's verdict reads the test metric at the end of the budget. Staleness can cost speed
without costing the end point (the pipelines on MNIST-1D: vanilla below sync at 9,000 updates,
level with it at 27,000), and a time to a fixed target says nothing when the target is above
what the task reaches. Two target-free readings of each run's test curve (the mean of the test
metric over the run's evaluations, ``test_mean``, a normalised area under the curve, and its
value at the last evaluation within the first third of the budget,
``test_third``) are taken from the cells' curves when the rows are copied
(:func:`curve_facts`, called by :func:`study.provenance.with_predictions`: the
curves are not committed), and :func:`notes` pairs them by seed as the verdicts pair the
test metric. Like every number the report gives, they are read on the test split, each arm
at its rate selected on validation (the curve of the run that selection picked); they carry
no claimed direction: the report lists them, not in the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["FIELDS", "curve_facts", "notes"]

#: the readings :func:`curve_facts` adds to a row
FIELDS = ("test_mean", "test_third")
#: where ``test_third`` is read
THIRD = "the last evaluation within a third of the budget"


def curve_facts(metrics: Sequence[Mapping[str, Any]], budget: int | None = None) -> dict[str, Any]:
    """``test_mean``, ``test_third`` and ``third_step`` of one run's metric records (``step``
    and ``test_<metric>``: accuracy, else loss) over a run of ``budget`` updates (default: its
    last record's); ``{}`` without a test curve. A record without a finite value (a
    diverged run's last) is left out.

    Example:
        >>> curve_facts([{"step": s, "test_accuracy": s / 100} for s in (10, 20, 30, 40, 50)], 60)
        {'test_mean': 0.3, 'test_third': 0.2, 'third_step': 20}
    """
    key = next(
        (k for k in ("test_accuracy", "test_loss") if any(k in m for m in metrics)),
        None,
    )
    if key is None:
        return {}
    pts = [(int(m["step"]), float(m[key])) for m in metrics if m.get(key) is not None]
    pts = [(s, v) for s, v in pts if v == v and abs(v) != float("inf")]
    if not pts:
        return {}
    last = max(budget or 0, max(s for s, _ in pts))  # a budget in other units is not used
    early = [(s, v) for s, v in pts if 3 * s <= last] or pts[:1]
    return {
        "test_mean": round(sum(v for _, v in pts) / len(pts), 6),
        "test_third": round(early[-1][1], 6),
        "third_step": early[-1][0],
    }


def notes(
    pairs: Sequence[tuple[Sequence[dict], Sequence[dict], str, str]],
    diff: Callable[[Sequence[dict], Sequence[dict], str, str], Any],
    metric: str = "accuracy",
) -> list[str]:
    """The report's speed lines: for each reading of :data:`FIELDS`, the paired difference
    ``a − b`` of every pair ``(a_rows, b_rows, a, b)`` whose rows carry it (``diff``: the
    claims' paired difference of the test metric, given rows whose test metric is that
    reading; the test predictions left out, as the reading is not a test number). Empty when
    no row carries the curve facts (rows copied before they were recorded)."""
    test = "final_test_loss" if metric == "loss" else "final_test_accuracy"
    out = []
    for field in FIELDS:
        parts, steps = [], set()
        for a_rows, b_rows, a, b in pairs:
            trained = [r for r in (*a_rows, *b_rows) if not r.get("diverged")]
            if not (a_rows and b_rows and trained) or not all(field in r for r in trained):
                continue  # a diverged run has no finite curve: the pair scores it as the test does
            steps |= {r.get("third_step") for r in (*a_rows, *b_rows) if not r.get("diverged")}
            d = diff(_as_test(a_rows, field, test), _as_test(b_rows, field, test), a, b)
            parts.append(d.text())
        if not parts:
            continue
        if field == "test_mean":
            label = f"the mean test {metric} over the run's evaluations"
        elif steps and max(steps) - min(steps) <= 0.01 * max(steps):
            at = f"update {max(steps):,}" if len(steps) == 1 else f"about update {max(steps):,}"
            label = f"the test {metric} at {at} ({THIRD})"
        else:
            label = f"the test {metric} at {THIRD}"
        out.append(f"  - {label}: " + "; ".join(parts))
    if out:
        head = "- speed, from the test curves (no claimed direction; not in the verdict):"
        out.insert(0, head)
    return out


def _as_test(rows: Sequence[dict], field: str, test: str) -> list[dict]:
    """The rows with ``field`` read as their test metric (no test predictions)."""
    return [{**r, test: r.get(field), "test_correct": None, "test_losses": None} for r in rows]
