"""The claims' machinery: verdicts, claims, the run folders' rows, paired differences and
the shared comparisons (``_compare``, ``_evidence``, the moonshot gaps)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxstale import runs


@dataclass
class Verdict:
    """A claim's outcome: ``verdict`` (held / held only when … / within noise / did not hold),
    one paragraph of evidence, tables (markdown) and figures (run name, file stem)."""

    verdict: str
    evidence: str
    tables: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Claim:
    """A published claim and how to judge it from the run folders."""

    id: str
    title: str
    source: str
    statement: str
    runs: tuple[str, ...]
    judge: Callable[[Context], Verdict]


class Context:
    """The run folders' rows, by configuration name."""

    def __init__(self, results: Path, quick: bool) -> None:
        self.results, self.quick = results, quick
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def path(self, name: str) -> Path:
        return self.results / name

    def has(self, name: str) -> bool:
        return (self.path(name) / "summary.json").exists()

    def rows(self, name: str) -> list[dict[str, Any]]:
        if name not in self._rows:
            summary = self.path(name) / "summary.json"
            if not summary.exists():
                raise FileNotFoundError(
                    f"no results for {name!r} in {self.path(name)}: run with --run"
                )
            self._rows[name] = json.loads(summary.read_text())["rows"]
        return self._rows[name]

    def config(self, name: str) -> dict[str, Any]:
        return json.loads((self.path(name) / "config.json").read_text())["config"]


# --------------------------------------------------------------------------------- judging


def chance_of(rows: Sequence[dict[str, Any]]) -> float:
    return 0.1  # every dataset here has 10 classes; a diverged seed scores as chance


def selected(
    rows: Sequence[dict[str, Any]], knob: Sequence[str] = ("lr", "lam"), **fields: Any
) -> list[dict[str, Any]]:
    """The rows of one group (``fields``) at its knob selected on validation."""
    group = [r for r in rows if all(r.get(k) == v for k, v in fields.items())]
    if not group:
        return []
    knob = tuple(k for k in knob if any(k in r for r in group))
    (pick,) = runs.select(group, by=(), knob=knob, chance=chance_of(group)).values()
    return [r for r in group if runs.stats.knob_value(r, knob) == pick]


def cell(rows: Sequence[dict[str, Any]]) -> str:
    """``mean ± CI [div.] @ lr`` of the rows of one selected group."""
    if not rows:
        return "–"
    text = runs.format_ci(
        [r.get("final_test_accuracy") for r in rows], diverged=[r["diverged"] for r in rows]
    )
    lr = rows[0].get("lr")
    return f"{text} @ {lr:g}" if isinstance(lr, float) else text


@dataclass
class Diff:
    """A paired difference a − b of test accuracy, in points."""

    a: str
    b: str
    mean: float
    half: float
    n: int

    @property
    def sign(self) -> int:
        """+1 / −1 when the 95 % interval excludes 0, else 0 (within noise)."""
        if self.n < 2 or not (self.half == self.half):  # NaN: one pair
            return 0
        if self.mean - self.half > 0:
            return 1
        if self.mean + self.half < 0:
            return -1
        return 0

    def text(self) -> str:
        if self.n == 0:
            return f"{self.a} − {self.b}: no seed where both trained"
        noise = {1: "beyond noise", -1: "beyond noise", 0: "within noise"}[self.sign]
        half = f" ± {100 * self.half:.1f}" if self.half == self.half else ""
        return (
            f"{self.a} − {self.b} = {100 * self.mean:+.1f}{half} points ({self.n} seeds, {noise})"
        )


def diff(a_rows: Sequence[dict], b_rows: Sequence[dict], a: str, b: str) -> Diff:
    return Diff(a, b, *runs.paired_difference(a_rows, b_rows))


def verdict_of(diffs: Sequence[Diff]) -> str:
    """held: every difference beyond noise in the claimed direction; did not hold: any beyond
    noise against it; else within noise."""
    if diffs and all(d.sign > 0 for d in diffs):
        return "held"
    if any(d.sign < 0 for d in diffs):
        return "did not hold"
    return "within noise"


def _async_table(
    ctx: Context, name: str, methods: Sequence[str], workers: Sequence[int], mu: float = 0.9
) -> str:
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    cols = [1, *(w for w in workers if w != 1)]
    body = []
    for m in methods:
        cells = []
        for w in cols:
            pick = selected(rows, method=m, workers=w) if (m == "sgd") == (w == 1) else []
            cells.append(cell(pick))
        body.append([m, *cells])
    return runs.markdown_table(["method", *(f"M={w}" for w in cols)], body)


def _ordering(
    ctx: Context,
    name: str,
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    mu: float = 0.9,
) -> list[Diff]:
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    return _compare(rows, better, workers, knob=("lr", "lam"))


def _compare(
    rows: Sequence[dict[str, Any]],
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    knob: Sequence[str],
) -> list[Diff]:
    """``a − b`` for every pair and worker count, each at its ``knob`` selected on validation
    (``sgd`` at M = 1)."""
    out = []
    for w in workers:
        for a, b in better:
            ra = selected(rows, knob=knob, method=a, workers=1 if a == "sgd" else w)
            rb = selected(rows, knob=knob, method=b, workers=1 if b == "sgd" else w)
            if ra and rb:
                out.append(diff(ra, rb, f"{a} (M={w})", f"{b} (M={w})"))
    return out


def _at_sync_rate(
    ctx: Context,
    name: str,
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    mu: float = 0.9,
) -> tuple[str, list[Diff] | None]:
    """The comparisons at one rate for every method: the rate selected on validation for
    1-worker SGD (as a practitioner without a per-method sweep would run); LC-ASGD's λ is still
    chosen on validation at that rate. ``(label, diffs)``; ``diffs`` None without SGD rows."""
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    ref = selected(rows, method="sgd", workers=1)
    if not ref:
        return "", None
    lr = ref[0]["lr"]
    out = _compare([r for r in rows if r["lr"] == lr], better, workers, knob=("lam",))
    return f"one rate for every method, 1-worker SGD's ({lr:g}, chosen on validation)", out


def _conditional(ctx: Context, name: str, fn: Callable[[], list[Diff]]) -> list[Diff] | None:
    return fn() if ctx.has(name) else None


def _evidence(main: list[Diff], cond: dict[str, list[Diff] | None]) -> tuple[str, str]:
    """The verdict and evidence text from the main comparisons and conditional ones."""
    v = verdict_of(main)
    lines = [f"- {d.text()}" for d in main]
    held_when = []
    for label, diffs in cond.items():
        if diffs is None:
            continue
        cv = verdict_of(diffs)
        lines.append(f"- {label}: **{cv}** — " + "; ".join(d.text() for d in diffs))
        if cv == "held" and v != "held":
            held_when.append(label)
    if held_when:
        v = "held only when " + " / ".join(held_when)
    return v, "\n".join(lines)


# ------------------------------------------------------------------------------- the claims


def _gap(best: list[dict], ref: list[dict], a: str, b: str, target: float) -> tuple[bool, str]:
    """Whether ``best`` is within ``target`` points of ``ref`` (paired mean gap), and the text."""
    d = diff(ref, best, b, a)
    ok = d.n > 0 and 100 * d.mean <= target
    miss = 100 * d.mean - target
    verdict = (
        "reached"
        if ok
        else f"not reached, by {miss:.2f}"
        if miss >= 0.005
        else "not reached, by < 0.01"
    )
    return ok, f"{d.text()}; mean gap {100 * d.mean:.2f}, target ≤ {target:g} points: {verdict}"


def _best(
    rows: Sequence[dict], candidates: Sequence[str], **fields: Any
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The candidates with the best mean validation accuracy at their selected rates: one, or
    several tied (the validation split is small, so exact ties happen)."""
    scored = []
    for m in candidates:
        pick = selected(rows, method=m, **fields)
        if pick:
            scored.append((runs.stats.score(pick, "final_val_accuracy", chance_of(pick)), m, pick))
    if not scored:
        return []
    top = max(t[0] for t in scored)
    return [(m, pick) for v, m, pick in scored if v >= top - 1e-12]


def _target(
    best: list[tuple[str, list[dict[str, Any]]]],
    ref: list[dict[str, Any]],
    what: str,
    ref_name: str,
    target: float,
) -> tuple[bool, list[str], set[str]]:
    """Whether the validation-best candidate is within ``target`` points of ``ref`` — every one
    of them when several tie on validation (the conservative reading) — with the text lines."""
    lines, oks = [], []
    tie = " (tied on validation with " if len(best) > 1 else ""
    for name, pick in best:
        ok, text = _gap(pick, ref, f"{name} ({what})", ref_name, target)
        oks.append(ok)
        others = [n for n, _ in best if n != name]
        lines.append(
            f"best on validation {name}{tie}{', '.join(others)}{')' if tie else ''}: {text}"
        )
    return all(oks), lines, {n for n, _ in best}


def _methods_of(ctx: Context, name: str, rows: Sequence[dict]) -> list[str]:
    """The methods of a run in its configuration's order (else in the rows' order)."""
    seen = list(dict.fromkeys(r["method"] for r in rows))
    try:
        order = list(ctx.config(name).get("methods") or [])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        order = []
    return [m for m in order if m in seen] + [m for m in seen if m not in order]
