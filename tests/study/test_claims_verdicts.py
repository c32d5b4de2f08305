"""study/verdicts.py and the judges' verdicts on hand-built run folders: every
verdict kind, the n ≥ 3 rule, the MDE, intention to treat at the dataset's chance level, trends,
a reversed condition in the headline, the one-rate conditions left out for rescaling methods."""

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy import stats

import study as claims
from jaxstale import data
from jaxstale.loop import encode_correct
from study.provenance import with_predictions
from study.verdicts import Diff, examples_variance, paired


def _d(values, name="a", unit="points"):
    return Diff(name, "b", tuple(values), tuple(values), b_error=0.1, unit=unit)


UP = _d([0.02, 0.021, 0.019, 0.02, 0.022], "up")  # beyond noise for the claim
DOWN = _d([-0.02, -0.021, -0.019, -0.02, -0.022], "down")  # beyond noise against it
FLAT = _d([0.0005, -0.0005, 0.001, -0.001, 0.0], "flat")  # within noise, MDE ≈ 0.1 points
WILD = _d([0.05, -0.06, 0.04, -0.05, 0.02], "wild")  # within noise, MDE ≈ 6 points


def test_diff_needs_three_pairs_to_be_beyond_noise():
    two = _d([0.05, 0.051])
    assert two.n == 2 and two.mean - two.half > 0  # the interval excludes 0 ...
    assert two.sign == 0 and "fewer than 3 pairs" in two.text()  # ... but two pairs say nothing
    assert math.isinf(two.mde)
    three = _d([0.05, 0.051, 0.052])
    assert three.sign == 1 and "beyond noise" in three.text()
    assert DOWN.sign == -1 and FLAT.sign == 0 and "within noise" in FLAT.text()


def test_minimum_detectable_effect_is_the_paired_t_power_formula():
    n, sd = WILD.n, float(np.std(WILD.values, ddof=1))
    want = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.80, n - 1)) * sd / math.sqrt(n)
    assert WILD.mde == pytest.approx(want)


def _predicted(method, correct_by_seed):
    return [
        {"method": method, "seed": s, "final_test_accuracy": float(np.mean(c)), "diverged": False,
         "test_correct": encode_correct(c)}
        for s, c in enumerate(correct_by_seed)
    ]  # fmt: skip


def test_test_set_resampling_adds_the_examples_variance_to_the_interval():
    rng = np.random.default_rng(0)
    a = rng.random((4, 200)) < 0.8
    b = a ^ (rng.random((4, 200)) < 0.1)  # b disagrees with a on about 10 % of the examples
    d = (a.astype(float) - b).mean(axis=0)  # per example, the mean over the seeds
    assert examples_variance(_predicted("a", a), _predicted("b", b), [0, 1, 2, 3]) == pytest.approx(
        d.var(ddof=1) / 200
    )
    got = paired(_predicted("a", a), _predicted("b", b), "a", "b", lambda rows: 0.1)
    seeds = (a.mean(axis=1) - b.mean(axis=1)).tolist()
    assert got.values == pytest.approx(tuple(seeds)) and got.test_var > 0
    fixed = Diff("a", "b", got.values)  # the same pairs, the test set taken as fixed
    assert got.se == pytest.approx(math.sqrt(fixed.se**2 + got.test_var))
    assert got.half > fixed.half and got.mde > fixed.mde
    # identical predictions: no test-set variance; rows without predictions: the set is fixed
    assert examples_variance(_predicted("a", a), _predicted("b", a), [0, 1, 2, 3]) == 0.0
    bare = [{k: v for k, v in r.items() if k != "test_correct"} for r in _predicted("b", b)]
    assert examples_variance(_predicted("a", a), bare, [0, 1]) == 0.0


def test_a_contrast_counts_the_test_sets_resampling_as_a_paired_difference_does():
    """Issue 53: a non-inferiority contrast (b + δ − a) and a difference of gaps had intervals
    without the test-resampling term; now Var_i(D_i)/N of the contrast's per-example values."""
    from study.verdicts import contrast, contrast_variance

    rng = np.random.default_rng(5)
    arms = [rng.random((4, 150)) < p for p in (0.8, 0.75, 0.7, 0.72)]
    w = (1.0, -1.0, -1.0, 1.0)
    d = sum(wk * a.astype(float) for wk, a in zip(w, arms, strict=True)).mean(axis=0)
    rows = [_predicted(f"m{k}", a) for k, a in enumerate(arms)]
    got = contrast_variance(list(zip(w, rows, strict=True)), [0, 1, 2, 3])
    assert got == pytest.approx(d.var(ddof=1) / 150)
    two = contrast([(1.0, rows[0]), (-1.0, rows[1])], "m0", "m1", lambda r: 0.1, offset=0.01)
    pair = paired(rows[0], rows[1], "m0", "m1", lambda r: 0.1)
    assert two.test_var == pair.test_var > 0 and two.half == pytest.approx(pair.half)
    assert two.mean == pytest.approx(pair.mean + 0.01)


def test_a_language_models_window_losses_enter_its_interval():
    """Per-window test losses (``test_losses``) resample the test windows as correctness does:
    Var_i(D_i)/N with D_i the mean over seeds of the two runs' loss difference on window i."""
    from jaxstale import tasks
    from jaxstale.loop import encode_losses

    rng = np.random.default_rng(3)
    a = 2.0 + rng.normal(0, 0.3, (5, 300))
    b = a + 0.05 + rng.normal(0, 0.1, (5, 300))
    a, b = (np.asarray(v.astype(np.float16), np.float64) for v in (a, b))  # as recorded

    def rows(method, losses):
        return [{"method": method, "seed": s, "final_test_loss": float(v.mean()),
                 "diverged": False, "test_losses": encode_losses(v)}
                for s, v in enumerate(losses)]  # fmt: skip

    want = (b - a).mean(axis=0).var(ddof=1) / 300
    assert examples_variance(rows("b", b), rows("a", a), range(5)) == pytest.approx(want)
    got = paired(rows("b", b), rows("a", a), "b", "a", lambda r: 4.4, tasks.language_model(83))
    assert got.test_var == pytest.approx(want) and got.mean == pytest.approx(0.05, abs=0.02)


def test_the_rows_copy_takes_each_rows_test_predictions_from_its_cell(tmp_path):
    cells = tmp_path / "cells"
    cells.mkdir()
    for seed, code in ((0, "2:QA=="), (1, None)):
        key = {"method": "sgd", "lr": 0.1, "seed": seed}
        last = {"step": 5, "test_accuracy": 0.5, **({"test_correct": code} if code else {})}
        (cells / f"{seed}.json").write_text(json.dumps({"key": key, "metrics": [last]}))
    rows = [{"method": "sgd", "lr": 0.1, "seed": s, "final_test_accuracy": 0.5} for s in (0, 1)]
    out = with_predictions(tmp_path, {"rows": rows, "n": 2})
    assert out["n"] == 2 and out["rows"][0]["test_correct"] == "2:QA=="
    assert "test_correct" not in out["rows"][1] and out["rows"][1]["test_mean"] == 0.5
    assert "test_correct" not in rows[0] and "test_mean" not in rows[1]  # the input unchanged
    # a language model's cell: its window losses travel the same way
    key = {"method": "sgd", "lr": 0.1, "seed": 0}
    last = {"step": 5, "test_loss": 1.5, "test_losses": "1:AD4="}
    (cells / "0.json").write_text(json.dumps({"key": key, "metrics": [last]}))
    out = with_predictions(tmp_path, {"rows": rows[:1]})
    assert out["rows"][0]["test_losses"] == "1:AD4=" and "test_correct" not in out["rows"][0]


@pytest.mark.parametrize(
    ("primary", "secondary", "label", "headline"),
    [
        (UP, {"x": [UP, FLAT]}, "held", "held"),
        (UP, {"raw inputs": [DOWN]}, "held with reversals",
         "held with reversals (reversed: raw inputs)"),
        (FLAT, {"other M": [UP]}, "suggestive", "suggestive (for the claim: other M)"),
        (FLAT, {"raw": [DOWN]}, "doubtful", "doubtful (reversed: raw)"),
        (FLAT, {"raw": [DOWN], "M": [UP]}, "doubtful",
         "doubtful (reversed: raw; for the claim: M)"),
        (DOWN, {"x": [UP]}, "did not hold", "did not hold"),
        (FLAT, {"x": [FLAT]}, "within noise", "within noise (MDE 0.1 vs expected 1.0 points)"),
        (WILD, {"x": [FLAT]}, "untestable here", "untestable here (MDE 8.6 vs expected 1.0 "),
        (_d([0.05, 0.06]), {}, "untestable here", "untestable here (fewer than 3 pairs"),
    ],
    ids=["held", "held-with-reversals", "suggestive", "doubtful", "doubtful-both-ways",
         "did-not-hold", "within-noise", "untestable", "two-pairs"],
)  # fmt: skip
def test_decide_every_outcome(primary, secondary, label, headline):
    d = claims.decide(primary, secondary, expected=0.01)
    assert d.label == label and d.label in claims.LABELS
    assert d.headline.startswith(headline), d.headline


def _rows(accs, lr=0.01, mu=0.9):
    return [
        {"method": m, "workers": w, "momentum": mu, "lr": lr, "lam": None, "seed": s,
         "diverged": v is None, "final_val_accuracy": v, "final_test_accuracy": v}
        for (m, w), vals in accs.items() for s, v in enumerate(vals)
    ]  # fmt: skip


def _folder(root, name, rows, workers, dataset="digits", **config):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    cfg = {"workers": workers, "dataset": dataset, **config}
    (d / "config.json").write_text(json.dumps({"config": cfg}))


BASE = [0.90, 0.91, 0.905, 0.895, 0.90]
NOISE = [0.0005, -0.0005, 0.001, -0.001, 0.0]


def _plus(xs, k):
    return [x + k for x in xs]


def _async(gains, ms=(4, 8, 16, 32)):
    """The default run: sgd, asgd at BASE; dc-asgd-a, ssgd and dc-asgd-c from ``gains``
    (method -> per-M offset from ASGD, a float or a list of per-seed offsets)."""
    accs = {("sgd", 1): _plus(BASE, 0.05)}
    for m in ms:
        accs[("asgd", m)] = BASE
        for meth, g in gains.items():
            off = g(m) if callable(g) else g
            accs[(meth, m)] = [b + o for b, o in zip(BASE, np.broadcast_to(off, 5), strict=True)]
    return accs


def test_c1_an_exploratory_condition_never_reaches_the_headline_a_declared_one_does(tmp_path):
    gains = {"dc-asgd-a": _plus(NOISE, 0.02), "ssgd": NOISE, "dc-asgd-c": NOISE}
    _folder(tmp_path, "async", _rows(_async(gains)), [4, 8, 16, 32])
    c1 = claims.claim("C1")
    v = c1.assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held", v.evidence
    assert "**primary**: dc-asgd-a (M=8) − asgd (M=8) = +2.0" in v.evidence
    assert "secondary, DC-ASGD-a − SSGD — for the claim" in v.evidence
    raw = _rows({("asgd", 16): BASE, ("dc-asgd-a", 16): _plus(BASE, -0.03)})
    _folder(tmp_path, "async-raw", raw, [16, 32])
    v = c1.assess(claims.Context(tmp_path, quick=False))
    # raw inputs is exploratory (not on C1's declared list): shown, beyond noise, not counted
    assert v.verdict == "held", v.evidence
    assert "- exploratory (not in the verdict), raw inputs, M = 16, 32: dc-asgd-a (M=16) − " \
        "asgd (M=16) = -3.0" in v.evidence  # fmt: skip
    # a declared secondary reversed beyond noise after Holm's correction reaches the headline
    gains["ssgd"] = _plus(NOISE, 0.05)
    _folder(tmp_path, "async", _rows(_async(gains)), [4, 8, 16, 32])
    v = c1.assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held with reversals (reversed: DC-ASGD-a − SSGD)", v.verdict
    assert "secondary, DC-ASGD-a − SSGD — **against the claim**: " in v.evidence
    report = claims.report(claims.Context(tmp_path, quick=False), tmp_path / "docs" / "c.md")
    # (the hand-built folders' configurations are not the code's: the caveat says so)
    assert "**Verdict: held with reversals (reversed: DC-ASGD-a − SSGD); on rows of an " in report
    assert "| **held with reversals** |" in report  # the headline table's short form
    for label in claims.LABELS:  # the header defines every label the report uses
        assert f"- **{label}**: " in report


def test_c1_uses_the_moonshots_64_and_128_workers(tmp_path):
    gains = {"dc-asgd-a": _plus(NOISE, 0.02), "ssgd": NOISE, "dc-asgd-c": NOISE}
    _folder(tmp_path, "async", _rows(_async(gains)), [4, 8, 16, 32])
    big = _async({"dc-asgd-a": _plus(NOISE, -0.05)}, ms=(64, 128))
    _folder(tmp_path, "async-m128", _rows(big), [64, 128])
    v = claims.claim("C1").assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held", v.verdict  # the moonshot's workers: an exploratory condition
    assert "exploratory (not in the verdict), round-robin workers, M = 64, 128" in v.evidence
    assert "dc-asgd-a (M=128) − asgd (M=128) = -5.0" in v.evidence


def _lam(rows, lam):
    return [{**r, "lam": lam} for r in rows]


def test_c1_and_c4_read_the_lambda_set_up_check_beside_the_default_run(tmp_path):
    """``async`` selects DC-ASGD-a's largest λ0 (an edge); ``async-lambda`` runs λ0 beyond it:
    the secondary selects (rate, λ) over both grids, paired with ``async``'s ASGD by seed."""
    gains = {"ssgd": NOISE, "dc-asgd-c": NOISE}
    base = _rows(_async(gains))
    dc = {("dc-asgd-a", m): _plus(BASE, 0.001) for m in (4, 8, 16, 32)}
    small = {("dc-asgd-a", m): _plus(BASE, -0.01) for m in (4, 8, 16, 32)}
    lc = {("lc-asgd", m): _plus(BASE, 0.002) for m in (4, 8, 16, 32)}
    rows = [*base, *_lam(_rows(dc), 20.0), *_lam(_rows(small), 2.0), *_lam(_rows(lc), 0.1)]
    rows += _lam(_rows(lc), -0.1)
    _folder(tmp_path, "async", rows, [4, 8, 16, 32])
    ctx = claims.Context(tmp_path, quick=False)
    v = claims.claim("C1").assess(ctx)
    assert "DC-ASGD-a's λ0 at its grid's edge at M = 4, 8, 16, 32" in v.evidence
    assert "check the compensation" in v.evidence and "async-lambda" not in v.evidence
    # the check: λ0 = 200 gains 2 points over ASGD at M = 8 and 16, λ0 = 2000 diverges
    wide = {("dc-asgd-a", m): _plus(BASE, 0.02) for m in (8, 16)}
    gone = {("dc-asgd-a", m): [None] * 5 for m in (8, 16)}
    check = [*_lam(_rows(wide), 200.0), *_lam(_rows(gone), 2000.0)]
    _folder(tmp_path, "async-lambda", check, [8, 16])
    ctx = claims.Context(tmp_path, quick=False)
    v = claims.claim("C1").assess(ctx)
    label = "set-up check added after the run: λ beyond the grid (async-lambda)"
    assert f"- {label}: dc-asgd-a (M=8) − asgd (M=8) = +2.0" in v.evidence
    assert v.setup == "set-up check, λ beyond the grid (async-lambda): 2 of 2 for the claim"
    assert "dc-asgd-a (M=16) − asgd (M=16) = +2.0" in v.evidence
    assert "the set-up check (async-lambda) runs λ beyond it at M = 8, 16" in v.evidence
    assert (
        "DC-ASGD-a's λ0 over both grids [2.0, 20.0, 200.0, 2000.0] (async-lambda added): "
        "M=8: +200, M=16: +200; inside the widened grid"
    ) in v.evidence
    # the primary still reads the default run alone (declared before the check existed)
    assert "**primary**: dc-asgd-a (M=8) − asgd (M=8) = +0.1" in v.evidence
    # C4: LC-ASGD (+0.2 over ASGD) against DC-ASGD-a over both grids (+2.0): reversed
    v = claims.claim("C4").assess(ctx)
    assert "lc-asgd (M=16) − dc-asgd-a (M=16) = -1.8" in v.evidence
    # a set-up check is beside the verdict, never in it (issue 53), whichever way it points
    assert v.setup.endswith(": 2 of 4 for the claim, 2 of 4 against it"), v.summary
    assert v.verdict == "held"
    # a check run at another budget than async's rows is not read with them
    _folder(tmp_path, "async-lambda", check, [8, 16], updates=27000)
    v = claims.claim("C1").assess(claims.Context(tmp_path, quick=False))
    assert "async-lambda" not in "".join(v.evidence.split("- DC-ASGD-a's λ0 at its grid")[0])
    assert (
        "the set-up check (async-lambda) ran under another configuration (updates None → "
        "27000): not read with these rows until they match"
    ) in v.evidence
    assert "over both grids" not in v.evidence
    # DC-ASGD-c is not in the check: its edge note does not name it
    rows = [r for r in rows if r["method"] != "dc-asgd-c"]
    rows.extend(_lam(_rows({("dc-asgd-c", m): BASE for m in (4, 8, 16, 32)}), 0.4))
    rows.extend(_lam(_rows({("dc-asgd-c", m): _plus(BASE, -0.01) for m in (4, 8, 16, 32)}), 0.04))
    _folder(tmp_path, "async", rows, [4, 8, 16, 32])
    v = claims.claim("C1").assess(claims.Context(tmp_path, quick=False))
    (line,) = [x for x in v.evidence.splitlines() if x.startswith("- DC-ASGD-c's λ0 at its grid")]
    assert "async-lambda" not in line and "check the compensation" in line


def test_c1_within_noise_and_untestable(tmp_path):
    gains = {"dc-asgd-a": NOISE, "ssgd": NOISE, "dc-asgd-c": NOISE}
    _folder(tmp_path, "async", _rows(_async(gains)), [4, 8, 16, 32])
    c1 = claims.claim("C1")
    v = c1.assess(claims.Context(tmp_path, quick=False))
    # expected: 10 % of ASGD's 9.8 % error = 1.0 point; MDE about 0.1
    assert v.verdict == "within noise (MDE 0.1 vs expected 1.0 points)", v.evidence
    assert "intention to treat: the same (no seed diverged)" in v.evidence
    wild = {"dc-asgd-a": [0.05, -0.06, 0.04, -0.05, 0.02], "ssgd": NOISE, "dc-asgd-c": NOISE}
    _folder(tmp_path, "async", _rows(_async(wild)), [4, 8, 16, 32])
    v = c1.assess(claims.Context(tmp_path, quick=False))
    assert v.label == "untestable here" and "vs expected 1.0 points" in v.verdict, v.verdict


def test_c3_did_not_hold(tmp_path):
    accs = _async({"dana": _plus(NOISE, -0.02)})
    _folder(tmp_path, "async", _rows(accs), [4, 8, 16, 32])
    v = claims.claim("C3").assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "did not hold" and "dana (M=32) − asgd (M=32) = -2.0" in v.evidence


def test_c3_pairs_dana_without_momentum_only_at_asyncs_budget(tmp_path):
    accs = _async({"dana": _plus(NOISE, 0.02)})
    _folder(tmp_path, "async", _rows(accs), [4, 8, 16, 32], updates=27000)
    no_mu = {("dana", m): _plus(BASE, -0.05) for m in (16, 32)}
    _folder(tmp_path, "async-momentum0", _rows(no_mu, mu=0.0), [16, 32], updates=27000,
            momentum=[0.0])  # fmt: skip
    v = claims.claim("C3").assess(claims.Context(tmp_path, quick=False))
    assert "dana μ=0.9 (M=32) − dana μ=0 (M=32) = +7.0" in v.evidence, v.evidence
    _folder(tmp_path, "async-momentum0", _rows(no_mu, mu=0.0), [16, 32], updates=9000,
            momentum=[0.0])  # fmt: skip
    v = claims.claim("C3").assess(claims.Context(tmp_path, quick=False))
    assert "dana μ=0.9" not in v.evidence
    assert (
        "- `async-momentum0`'s rows not read with `async`'s: its configuration differs outside "
        "momentum, lrs, methods, workers, lc_lambdas, dc_lambda_scales (updates 27000 → 9000); "
        "a seed pairs across runs of one set-up only (momentum helps DANA: not judged)"
    ) in v.evidence
    assert v.verdict == "held", v.verdict


def test_c2_is_a_trend_in_m_and_leaves_the_one_rate_conditions_out(tmp_path):
    # Gap-Aware's advantage grows by one point per doubling of M: 2, 3, 4, 5 points
    grow = {"gap-aware": lambda m: _plus(NOISE, 0.01 * math.log2(m)), "sa-asgd": NOISE}
    _folder(tmp_path, "async", _rows(_async(grow)), [4, 8, 16, 32])
    # at one fixed rate, SA-ASGD wins beyond noise: not neutral, so it must not count
    fixed = _rows({("gap-aware", 16): BASE, ("sa-asgd", 16): _plus(BASE, 0.05)}, lr=0.02)
    _folder(tmp_path, "async-fixed-lr", fixed, [16])
    c2 = claims.claim("C2")
    v = c2.assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held", v.evidence
    primary = v.evidence.splitlines()[0]
    assert (
        primary.startswith(
            "- **primary**: slope of gap-aware − sa-asgd against log2 M (M = 4, 8, 16, 32) = +1.0"
        )
        and "points per doubling of M (5 seeds, beyond noise)" in primary
    )
    assert "not used: the one-rate" in v.evidence
    assert "secondary, one" not in v.evidence  # neither the fixed rate nor SGD's
    # a constant advantage: beats SA-ASGD at every M but not increasingly so
    flat = {"gap-aware": _plus(NOISE, 0.02), "sa-asgd": NOISE}
    _folder(tmp_path, "async", _rows(_async(flat)), [4, 8, 16, 32])
    v = c2.assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == (
        "suggestive (for the claim: Gap-Aware − SA-ASGD at each worker count, own rates)"
    ), v.verdict


def test_trend_is_the_per_seed_slope_against_log2():
    def rows(meth, vals):
        return [{"method": meth, "seed": s, "diverged": False, "final_test_accuracy": v}
                for s, v in enumerate(vals)]  # fmt: skip

    # seed s gains 0.01 per doubling plus a per-seed offset: every slope is exactly 0.01
    pts = [(m, rows("a", [b + 0.01 * k + 0.001 * s for s, b in enumerate(BASE)]), rows("b", BASE))
           for k, m in enumerate((2, 4, 8))]  # fmt: skip
    t = claims.trend(pts, "a", "b", "N")
    assert t.n == 5 and t.mean == pytest.approx(0.01) and t.half == pytest.approx(0, abs=1e-9)
    assert t.sign == 1
    assert t.unit == "points per doubling of N" and t.text().startswith("slope of a − b against")


def _five(data_dir):
    y = np.arange(100) % 5
    x = (np.arange(100)[:, None] * np.ones((1, 3))).astype(np.float32)
    return x[:80], y[:80], x[80:], y[80:], 5


def test_itt_companion_scores_a_diverged_seed_at_the_datasets_chance(tmp_path):
    data.register_dataset("claims-test-five", _five, overwrite=True)
    gains = {"dc-asgd-a": _plus(NOISE, 0.02), "ssgd": NOISE, "dc-asgd-c": NOISE}
    rows = _rows(_async(gains))
    for r in rows:  # seed 4 of DC-ASGD-a at M = 8 diverged
        if r["method"] == "dc-asgd-a" and r["workers"] == 8 and r["seed"] == 4:
            r["diverged"], r["final_test_accuracy"], r["final_val_accuracy"] = True, None, None
    _folder(tmp_path, "async", rows, [4, 8, 16, 32], dataset="claims-test-five")
    ctx = claims.Context(tmp_path, quick=False)
    assert ctx.chance("async") == pytest.approx(0.2)
    v = claims.claim("C1").assess(ctx)
    primary = v.evidence.splitlines()[0]
    assert "dc-asgd-a (M=8) − asgd (M=8) = +2.0 ± 0.1 points (4 seeds, beyond noise)" in primary
    # the ITT mean: four seeds +2.0, seed 4 at 20 % − 90 % = −70 points: (8 − 70) / 5 = −12.4
    assert "intention to treat (diverged seeds at chance, 20 %): -12.4" in primary
    assert "over 5 seeds" in primary


def test_chance_comes_from_the_rows_dataset_not_a_constant():
    data.register_dataset("claims-test-five", _five, overwrite=True)
    assert claims.chance_of([{"dataset": "claims-test-five"}]) == pytest.approx(0.2)
    assert claims.chance_of([{"dataset": "digits"}]) == pytest.approx(0.1)
    assert claims.chance_of([{"num_classes": 2}]) == 0.5  # a recorded class count wins
    with pytest.raises(ValueError, match="name 0 datasets"):
        claims.chance_of([{"seed": 0}])


def _pipe(accs, lr=0.01):
    return [
        {"method": m, "model": "mlp", "stages": n, "lr": lr, "seed": s, "diverged": v is None,
         "final_val_accuracy": v, "final_test_accuracy": v}
        for (m, n), vals in accs.items() for s, v in enumerate(vals)
    ]  # fmt: skip


def test_p1_one_reversed_cell_makes_it_held_with_reversals_not_did_not_hold(tmp_path):
    # the case: prediction wins at N = 8, NAG loses at N = 4 (one cell)
    accs = {("sync", n): _plus(BASE, 0.05) for n in (2, 4, 8)}
    for n in (2, 4, 8):
        accs[("vanilla", n)] = BASE
        accs[("stash", n)] = BASE
        accs[("spectrain-v1", n)] = [b + g for b, g in zip(BASE, _plus(NOISE, 0.02), strict=True)]
    accs[("nesterov", 4)] = _plus(BASE, -0.02)
    accs[("nesterov", 8)] = _plus(BASE, 0.02)
    _folder(tmp_path, "pipeline", _pipe(accs), [])
    v = claims.claim("P1").assess(claims.Context(tmp_path, quick=False))
    # the cell reverses NAG − vanilla and NAG − stash; NAG − vanilla at sync's rate is the same
    # runs (every selected rate is sync's here): listed as a repeat, not a second reversal
    assert v.verdict == (
        "held with reversals (reversed: NAG prediction − vanilla; prediction − stashing)"
    ), v.evidence
    assert "— repeats NAG prediction − vanilla (the same per-seed results" in v.evidence
    assert v.evidence.startswith("- **primary**: spectrain-v1 (N=8) − vanilla (N=8) = +")
    assert "further differences (no claimed direction; not in the verdict)" in v.evidence


def test_p1_trend_in_n_reversed_reaches_the_headline(tmp_path):
    # SpecTrain's gain shrinks with depth (4, 2, 1 points at N = 2, 4, 8): still a gain at N = 8
    accs = {}
    for k, n in enumerate((2, 4, 8)):
        accs[("sync", n)] = _plus(BASE, 0.05)
        accs[("vanilla", n)] = BASE
        accs[("spectrain-v1", n)] = [
            b + g for b, g in zip(BASE, _plus(NOISE, 0.04 / 2**k), strict=True)
        ]
    _folder(tmp_path, "pipeline", _pipe(accs), [])
    v = claims.claim("P1").assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held with reversals (reversed: trend in N (staleness grows with depth))", (
        v.evidence
    )
    assert "slope of spectrain-v1 − vanilla against log2 N (N = 2, 4, 8) = -1.5" in v.evidence


def test_every_seed_diverged_in_one_arm_is_untestable_with_the_itt_companion_shown():
    a = [{"seed": s, "dataset": "digits", "diverged": False, "final_test_accuracy": 0.9}
         for s in range(3)]  # fmt: skip
    b = [{"seed": s, "dataset": "digits", "diverged": True, "final_test_accuracy": None}
         for s in range(3)]  # fmt: skip
    d = claims.diff(a, b, "a", "b")
    assert d.n == 0 and d.itt == pytest.approx((0.8, 0.8, 0.8))
    assert d.text() == (
        "a − b: no seed where both trained; intention to treat (diverged seeds at chance, "
        "10 %): +80.0 ± 0.0 over 3 seeds"
    )
    got = claims.decide(d, {}, math.nan)
    assert got.headline == "untestable here (fewer than 3 pairs; no expected effect)"


def test_distinct_drops_a_comparison_of_the_same_runs_and_says_which_it_repeats():
    from study.decisions import distinct

    a, b, c = _d([0.01, 0.02, 0.03]), _d([0.01, 0.02, 0.04]), _d([-0.05, -0.04, -0.06])
    other = dataclasses.replace(b, a="another arm")  # the same numbers, other runs: kept
    kept, repeats = distinct(
        a, {"x": [b, _d([0.01, 0.02, 0.03])], "y": [c, _d([0.01, 0.02, 0.04]), other]}
    )
    assert kept == {"x": [b], "y": [c, other]}
    assert [(lab, was) for lab, _, was in repeats] == [("x", "primary"), ("y", "x")]
    assert claims.decide(a, kept, 0.01).against == ("y",)
