"""Issue 53's verdict rules 2 and 3 on hand-built differences: "mixed" split into its two
states, declared secondaries corrected together (Holm) and the only ones that qualify a
verdict, set-up checks beside the verdict whichever way they point."""

from types import SimpleNamespace

import pytest

import study as claims
from study.core import Claim, Evidence
from study.decisions import corrected, holm, partition, setup_summary
from study.verdicts import Diff


def _d(values, a="a"):
    return Diff(a, "b", tuple(values), tuple(values), b_error=0.1)


def _like(d, a):
    """The same numbers for another arm (not a repeat of ``d``: :func:`decisions.distinct`)."""
    return Diff(a, d.b, d.values, d.itt, b_error=d.b_error)


UP = _d([0.02, 0.021, 0.019, 0.02, 0.022])
FLAT = _d([0.0005, -0.0005, 0.001, -0.001, 0.0])
#: beyond noise against the claim on its own (p ≈ 0.024), not after Holm over 5 (0.05 / 5)
MARGINAL = _d([-0.01, -0.002, -0.018, -0.006, -0.014])


def test_holm_steps_down_on_hand_computed_p_values():
    # p sorted 0.01, 0.03, 0.04, 0.5 against 0.05/4, 0.05/3, 0.05/2, 0.05: only the first
    ps = [0.04, 0.01, 0.5, 0.03]
    fake = [SimpleNamespace(p=p, sign=-1 if i == 1 else 1) for i, p in enumerate(ps)]
    assert holm(fake) == [0, -1, 0, 0]
    # 0.01, 0.012, 0.02 against 0.0167, 0.025, 0.05: all three (step-down, not Bonferroni)
    fake = [SimpleNamespace(p=p, sign=1) for p in (0.02, 0.01, 0.012)]
    assert holm(fake) == [1, 1, 1]
    assert holm([]) == []


@pytest.mark.parametrize("d", [UP, FLAT, MARGINAL, _d([0.01, 0.03]), _d([0.1, -0.2, 0.05])])
def test_a_differences_p_value_agrees_with_its_interval(d):
    assert (d.p < claims.verdicts.ALPHA) == bool(d.sign), (d.p, d.sign)
    assert 0.0 <= d.p <= 1.0


def test_a_secondary_beyond_noise_alone_but_not_after_holm_does_not_qualify():
    assert MARGINAL.sign == -1 and 0.05 / 5 < MARGINAL.p < 0.05
    family = {"other M": [MARGINAL, FLAT, FLAT], "pair": [FLAT], "trend": [FLAT]}
    # before issue 53 any one secondary beyond noise made the verdict "mixed"
    assert claims.decide(UP, family, 0.01).headline == "held"
    assert corrected(family) == {"other M": [0, 0, 0], "pair": [0], "trend": [0]}
    alone = {"other M": [MARGINAL]}  # a family of one: not corrected away
    assert claims.decide(UP, alone, 0.01).headline == "held with reversals (reversed: other M)"


def _claim(**kw):
    return Claim("X1", "t", "s", "st", ("r",), lambda ctx: None, primary="p", expected=0.1, **kw)


def test_only_the_declared_secondaries_qualify_the_verdict_and_set_up_checks_sit_beside_it():
    down = _d([-0.02, -0.021, -0.019, -0.02, -0.022])
    sec = {
        "the other M": [FLAT],
        "raw inputs": [down],  # exploratory: shown, never counted
        "set-up check added after the run: λ beyond (x)": [_like(UP, "c"), _like(FLAT, "c")],
    }
    declared, exploratory, checks = partition(sec, ("the other M",))
    assert list(declared) == ["the other M"] and list(exploratory) == ["raw inputs"]
    assert list(checks) == ["set-up check added after the run: λ beyond (x)"]
    v = _claim(secondaries=("the other M",)).render(Evidence(UP, sec))
    assert v.verdict == "held" and v.label == "held"
    assert "- exploratory (not in the verdict), raw inputs: a − b = -2.0" in v.evidence
    assert v.setup == "set-up check, λ beyond (x): 1 of 2 for the claim"
    assert v.summary == "held; set-up check, λ beyond (x): 1 of 2 for the claim"
    # declared and reversed: the headline names it
    sec["the other M"] = [down]
    v = _claim(secondaries=("the other M",)).render(Evidence(UP, sec))
    assert v.verdict == "held with reversals (reversed: the other M)"
    assert "secondary, the other M — **against the claim**: " in v.evidence
    # D4's case: the primary against the claim, its set-up check for it: both in the summary
    nine = [_like(UP, f"arm {i}") for i in range(9)]
    v = _claim(secondaries=("the other M",)).render(Evidence(down, {sec_key(sec): nine}))
    assert v.summary == "did not hold; set-up check, λ beyond (x): 9 of 9 for the claim"


def sec_key(sec):
    return next(k for k in sec if k.startswith("set-up"))


def test_a_lost_to_correction_secondary_says_so():
    sec = {"other M": [MARGINAL, *(_like(FLAT, f"M={m}") for m in (2, 4, 16, 32))]}
    v = _claim(secondaries=("other M",)).render(Evidence(UP, sec))
    assert v.verdict == "held"
    assert "(1 beyond noise alone, not after Holm's correction)" in v.evidence


def test_setup_summary_reads_every_direction():
    assert setup_summary({}) == ""
    assert setup_summary({"set-up check": [FLAT]}) == "set-up check: 0 of 1 beyond noise"
    down = _d([-0.02, -0.021, -0.019, -0.02, -0.022])
    got = setup_summary({"set-up check added: α = 0 (a0)": [UP, down, FLAT]})
    assert got == "set-up check, α = 0 (a0): 1 of 3 for the claim, 1 of 3 against it"


@pytest.mark.parametrize(
    ("verdict", "short"),
    [
        ("held with reversals (reversed: a long list; of labels)", "held with reversals"),
        ("suggestive (for the claim: x)", "suggestive"),
        ("untestable here (MDE 0.7 vs expected 0.2 points)", "untestable (MDE > expected)"),
        ("untestable here (an arm of the primary at chance at every rate)",
         "untestable (arm at chance)"),
        ("untestable here (no assay sensitivity: vanilla (N=8) passes the same test)",
         "untestable (no assay sensitivity)"),
        ("untestable here (fewer than 3 pairs; no expected effect)", "untestable (too few pairs)"),
        ("not reached, the upper bound above it by 0.3", "not reached"),
    ],
)  # fmt: skip
def test_the_headlines_verdict_is_at_most_forty_characters(verdict, short):
    v = claims.Verdict(verdict, "")
    assert v.short == short and len(v.short) <= 40


def test_every_declared_secondary_names_a_label_its_judge_writes():
    """A typo in a declared prefix would silently demote that secondary to exploratory: every
    prefix must match a secondary the claim's judge writes on the committed rows (a claim
    whose runs are not all committed may lack the ones those runs write: its own test checks
    them, e.g. test_claims_rl's RL3)."""
    from pathlib import Path

    from study import provenance

    snap = provenance.read_index(Path(claims.__file__).parent / "claims" / "rows")
    ctx = claims.Context(snap.rows, snap.quick)
    missed = []
    for c in claims.CLAIMS:
        if not c.secondaries or not ctx.has(c.runs[0]):
            continue
        ev = c.judge(ctx)
        if not isinstance(ev, Evidence) or ev.primary is None:
            continue
        labels = list(ev.secondary)
        gone = [x for x in c.secondaries if not any(k.startswith(x) for k in labels)]
        if not all(ctx.has(r) for r in c.runs) and len(gone) < len(c.secondaries):
            continue  # partial: some declared secondary is written, the rest need other runs
        missed += [(c.id, x) for x in c.secondaries if not any(k.startswith(x) for k in labels)]
    assert not missed, missed


@pytest.mark.parametrize(
    ("values", "unit", "edge", "reversible"),
    [
        ([0.02, 0.021, 0.019, 0.02, 0.022], "points", "b", True),  # a better b may close it
        ([0.02, 0.021, 0.019, 0.02, 0.022], "points", "a", False),  # a better a widens it
        ([-0.02, -0.021, -0.019, -0.02, -0.022], "points", "a", True),  # may turn it round
        ([0.2, 0.21, 0.19, 0.2, 0.22], "nats", "a", True),  # a loss: a better a lowers a − b
        ([0.2, 0.21, 0.19, 0.2, 0.22], "nats", "b", False),
        ([0.001, -0.001, 0.0005, -0.0005, 0.0], "points", "b", False),  # no reading to reverse
    ],
)
def test_an_arm_at_its_grids_edge_that_could_reverse_the_primary_makes_it_untestable(
    values, unit, edge, reversible
):
    arm = {"a": "method", "b": "reference"}[edge]
    scale = 1.0 if unit == "nats" else 100.0
    p = Diff("method", "reference", tuple(values), tuple(values), b_error=0.1, unit=unit,
             scale=scale, edges=(f"{arm} at its grid's smallest rate",))  # fmt: skip
    from study.verdicts import reversible_edges

    assert bool(reversible_edges(p)) == reversible
    v = _claim().render(Evidence(p))
    if reversible:
        assert v.short == "untestable (arm at its grid's edge)", v.verdict
        assert "- **not testable as run**" in v.evidence
    else:
        assert not v.label.startswith("untestable") or v.short.endswith("expected)"), v.verdict
        assert v.caveat == f"a bound: {arm} at its grid's smallest rate"


def test_a_verdict_an_estimated_expected_effect_decides_says_so():
    """Issue 53 rule 7: "within noise" against "untestable here" turns on the expected effect;
    where that is an estimate (not checked against the paper's tables) the caveat says so."""
    flat = _like(FLAT, "x")
    v = _claim(expected_estimate=True).render(Evidence(flat))
    assert v.label == "within noise" and v.caveat == claims.core.ESTIMATE
    assert "expected effect an estimate" in claims.headline.qualifiers(v)
    assert not _claim().render(Evidence(flat)).caveat  # a checked one: no caveat
    assert not _claim(expected_estimate=True).render(Evidence(UP)).caveat  # not decided by it


def test_the_primarys_selection_margin_is_printed_from_the_rows(tmp_path):
    """Issue 53: the selection's own uncertainty — each primary arm's selected rate, the
    runner-up and the validation gap between them, over the seeds every rate ran."""
    import json

    rows = []
    for method, accs in (
        ("asgd", {0.01: 0.80, 0.03: 0.84}),
        ("dc-asgd-a", {0.01: 0.86, 0.03: 0.85}),
    ):
        for lr, acc in accs.items():
            rows += [{"method": method, "workers": 8, "momentum": 0.9, "lr": lr, "lam": None,
                      "seed": s, "diverged": False, "final_val_accuracy": acc + 0.001 * s,
                      "final_test_accuracy": acc + 0.001 * s} for s in range(3)]  # fmt: skip
    d = tmp_path / "async"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    (d / "config.json").write_text(json.dumps({"config": {"dataset": "digits", "workers": [8]}}))
    v = claims.claim("C1").assess(claims.Context(tmp_path, quick=False))
    line = next(x for x in v.evidence.splitlines() if "selection's own uncertainty" in x)
    assert line.endswith("points): dc-asgd-a (M=8) 0.01 over 0.03 by 1.0; asgd (M=8) 0.03 over "
                         "0.01 by 4.0"), line  # fmt: skip
