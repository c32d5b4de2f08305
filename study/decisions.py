"""The verdict rule: a claim's label from its primary :class:`~study.verdicts.Diff`, its
declared secondaries corrected together (Holm), its set-up checks beside it.

:func:`decide` is the rule (see its docstring); :func:`partition` sorts a claim's secondaries
into declared, exploratory and set-up checks; :func:`distinct` drops a secondary that repeats
the primary's comparison.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .verdicts import ALPHA, MIN_PAIRS, Diff

#: the labels :func:`decide` returns, with the definitions the report's header prints ("a
#: declared secondary": one of the claim's short pre-declared list, beyond noise after Holm's
#: correction over that list, :func:`holm`; issue 53 split "mixed" into its two states)
LABELS: dict[str, str] = {
    "held": "the primary comparison is beyond noise in the claimed direction and no declared "
    "secondary is beyond noise against it",
    "held with reversals": "the primary is beyond noise for the claim, but a declared "
    "secondary is beyond noise against it (named)",
    "suggestive": "the primary is within noise and a declared secondary is beyond noise for "
    "the claim, none against it (named): a lead for a new primary, not a verdict",
    "doubtful": "the primary is within noise and a declared secondary is beyond noise against "
    "the claim (named)",
    "within noise": "nothing beyond noise although the primary could have shown the paper's "
    "effect: its minimum detectable effect (80 % power) is at most the expected effect",
    "did not hold": "the primary comparison is beyond noise against the claim",
    "untestable here": "nothing beyond noise, and the primary's minimum detectable effect (80 % "
    "power) is larger than the paper's effect rescaled to this task: the runs could not have "
    "seen it (both printed)",
}

#: the label prefix of a set-up check (a configuration added after the run to check the set-up
#: the claim was run under): reported beside the verdict whichever way it points, never part of it
SETUP = "set-up check"


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`: ``label`` (a key of :data:`LABELS`), ``headline`` (the
    label with what it rests on), the secondary labels beyond noise ``for`` and ``against``
    the claim, and the primary's MDE and the expected effect (fractions)."""

    label: str
    headline: str
    for_claim: tuple[str, ...]
    against: tuple[str, ...]
    mde: float
    expected: float
    #: each declared secondary's signs after Holm's correction (:func:`corrected`), by label
    signs: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)


def distinct(
    primary: Diff, secondary: Mapping[str, Sequence[Diff]]
) -> tuple[dict[str, list[Diff]], list[tuple[str, Diff, str]]]:
    """The secondaries without the comparisons that repeat an earlier one — the same arms and
    per-seed values, companions and test-set variance: a condition whose selected rates are
    the own-rate selections compares the same runs again (issue 53: P1's ``nesterov (N=8) −
    vanilla`` was listed, and counted as a reversal, twice) — and the repeats as ``(label,
    diff, the label it repeats)`` (``"primary"`` for the primary's)."""
    seen: dict[tuple[Any, ...], str] = {_same(primary): "primary"}
    kept: dict[str, list[Diff]] = {}
    repeats: list[tuple[str, Diff, str]] = []
    for label, diffs in secondary.items():
        for d in diffs:
            key = _same(d)
            if key in seen:
                repeats.append((label, d, seen[key]))
                continue
            seen[key] = label
            kept.setdefault(label, []).append(d)
    return kept, repeats


def _same(d: Diff) -> tuple[Any, ...]:
    return (d.a, d.b, d.values, d.itt, d.test_var, d.what)


def holm(diffs: Sequence[Diff], alpha: float = ALPHA) -> list[int]:
    """Each difference's sign after Holm's step-down correction over ``diffs`` (the family):
    ordered by p-value, the k-th smallest (k = 1, 2, …) is beyond noise while every p up to it
    is at most ``alpha / (m − k + 1)``; +1 / −1 for those (their mean's sign), 0 for the rest.
    The family-wise error rate is at most ``alpha`` whatever the dependence between them.

    References:
        Holm, S. (1979). A simple sequentially rejective multiple test procedure. Scandinavian
        Journal of Statistics 6(2), 65–70.
    """
    out, m = [0] * len(diffs), len(diffs)
    for k, i in enumerate(sorted(range(m), key=lambda j: diffs[j].p)):
        d = diffs[i]
        if not (d.p <= alpha / (m - k) and d.sign):
            break
        out[i] = d.sign
    return out


def partition(
    secondary: Mapping[str, Sequence[Diff]], declared: Sequence[str]
) -> tuple[dict[str, list[Diff]], dict[str, list[Diff]], dict[str, list[Diff]]]:
    """``(declared, exploratory, set-up checks)``: the secondaries whose label starts with one
    of the claim's ``declared`` prefixes (its short pre-declared list: corrected together, the
    only ones that qualify its verdict), those whose label starts with :data:`SETUP` (reported
    beside the verdict, never part of it) and the rest (exploratory: shown, uncorrected)."""
    out: tuple[dict[str, list[Diff]], ...] = ({}, {}, {})
    for label, diffs in secondary.items():
        k = 2 if label.startswith(SETUP) else 0 if label.startswith(tuple(declared)) else 1
        out[k][label] = list(diffs)
    return out[0], out[1], out[2]


def corrected(secondary: Mapping[str, Sequence[Diff]]) -> dict[str, list[int]]:
    """The declared secondaries' signs after :func:`holm` over all of them, by label."""
    flat = [(k, d) for k, ds in secondary.items() for d in ds]
    signs = holm([d for _, d in flat])
    out: dict[str, list[int]] = {k: [] for k in secondary}
    for (k, _), sgn in zip(flat, signs, strict=True):
        out[k].append(sgn)
    return out


def setup_summary(checks: Mapping[str, Sequence[Diff]]) -> str:
    """One phrase per set-up check for the verdict's line, whichever way it points:
    ``"set-up check (λ beyond the grid): 2 of 4 for the claim"`` (uncorrected: a check of the
    set-up, not a test of the claim); empty without one."""
    parts = []
    for label, diffs in checks.items():
        what = label.split(": ", 1)[1] if ": " in label else ""
        up, down = sum(d.sign > 0 for d in diffs), sum(d.sign < 0 for d in diffs)
        n = len(diffs)
        ways = [f"{up} of {n} for the claim"] * bool(up) + [f"{down} of {n} against it"] * bool(
            down
        )
        parts.append(f"set-up check{f', {what}' if what else ''}: "
                     + (", ".join(ways) if ways else f"0 of {n} beyond noise"))  # fmt: skip
    return "; ".join(parts)


def decide(primary: Diff, secondary: Mapping[str, Sequence[Diff]], expected: float) -> Decision:
    """The verdict rule. ``primary``: the declared comparison (positive = the claim);
    ``secondary``: the claim's declared secondaries by label (same orientation; exploratory
    ones and set-up checks are not passed: :func:`partition`), read after Holm's correction over
    all of them (:func:`corrected`); ``expected``: the paper's effect rescaled to this task (a
    fraction, same unit as the primary).

    * **did not hold** — the primary is beyond noise against the claim;
    * **held** — the primary is beyond noise for it and no secondary is beyond noise against;
    * **held with reversals** — the primary is beyond noise for it and some secondary is beyond
      noise against it (headline: ``held with reversals (reversed: <labels>)``);
    * **suggestive** / **doubtful** — the primary is within noise and some secondary is beyond
      noise for the claim (none against) / against it (headline names them);
    * **untestable here** — nothing beyond noise and the primary's MDE > ``expected`` (or
      ``expected`` unknown);
    * **within noise** — nothing beyond noise and MDE ≤ ``expected``.
    """
    signs = corrected(secondary)
    up = tuple(k for k, ss in signs.items() if any(x > 0 for x in ss))
    down = tuple(k for k, ss in signs.items() if any(x < 0 for x in ss))
    mde, unit = primary.mde, primary.unit

    def out(label: str, headline: str) -> Decision:
        return Decision(label, headline, up, down, mde, expected, signs)

    if primary.sign < 0:
        return out("did not hold", "did not hold")
    if primary.sign > 0:
        if down:
            return out("held with reversals", f"held with reversals (reversed: {'; '.join(down)})")
        return out("held", "held")
    if down:
        parts = [f"reversed: {'; '.join(down)}"] + (
            [f"for the claim: {'; '.join(up)}"] if up else []
        )
        return out("doubtful", f"doubtful ({'; '.join(parts)})")
    if up:
        return out("suggestive", f"suggestive (for the claim: {'; '.join(up)})")
    got = f"MDE {primary.fmt(mde)}" if math.isfinite(mde) else f"fewer than {MIN_PAIRS} pairs"
    want = (
        f"expected {primary.fmt(expected)} {unit}"
        if math.isfinite(expected)
        else "no expected effect"
    )
    sizes = f"{got} vs {want}" if math.isfinite(mde) else f"{got}; {want}"
    if not math.isfinite(expected) or not mde <= expected:
        return out("untestable here", f"untestable here ({sizes})")
    return out("within noise", f"within noise ({sizes})")


def sensitivity(
    control: Diff | None, premise: Diff | None, label: str, headline: str
) -> tuple[list[str], str]:
    """The report lines and the headline after a claim's two checks of its own test.

    ``control`` (a non-inferiority claim's negative control, oriented as the primary): if the
    arm that should fail the test passes it too, a *held* verdict is no verdict (no assay
    sensitivity). ``premise`` (the failure a fix should prevent, ``uncorrected − reference +
    margin``): unless it is negative beyond noise, the regime shows no failure to prevent, and
    whatever the primary says, the claim is untestable here; this check outranks the label.
    """
    lines: list[str] = []
    if control is not None:
        passes = control.sign > 0
        what = f"the negative control ({control.b}: should fail the same test)"
        flag = " — **it passes too**" if passes else ""
        lines.append(f"- assay sensitivity, {what}: {control.text()}{flag}")
        if passes and label.startswith("held"):
            headline = f"untestable here (no assay sensitivity: {control.b} passes the same test)"
    if premise is not None:
        shown = premise.sign < 0
        what = f"the failure to prevent ({premise.a} worse than {premise.b} beyond the margin)"
        flag = "" if shown else " — **not shown**"
        lines.append(f"- premise, {what}: {premise.text()}{flag}")
        if not shown:
            headline = (f"untestable here (no failure to prevent: {premise.a} stays within the "
                        f"margin of {premise.b})")  # fmt: skip
    return lines, headline
