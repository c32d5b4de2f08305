"""study/localsgd.py: the DiLoCo-family claims D1–D5 judged from hand-built run
folders of local_sgd (test accuracy): non-inferiority against data parallelism and DiLoCo, D3's
margin taken from the runs and its wall-clock secondary, D4's primary on the lowest precision at
the largest overlap, D5's trend over the worker count, and the report listing them."""

import json

import numpy as np
import pytest

import study as claims
from study import localsgd

JITTER = np.array([0.0, 0.002, -0.002, 0.001, -0.001])  # one seed's luck, shared by its arms


def _accs(base):
    return [float(base + j) for j in JITTER]


def _rows(cells, lrs=(0.7,)):
    """local_sgd rows: {(method, M, H): per-seed test accuracies (None: diverged)}; validation
    = test at the first rate, 0.1 lower at any other (never selected)."""
    rows = []
    for (m, w, h), vals in cells.items():
        for i, lr in enumerate(lrs):
            for s, v in enumerate(vals):
                bad = v is None
                rows.append({"model": "mlp", "method": m, "workers": w, "inner_steps": h,
                             "lr": lr, "seed": s, "diverged": bad,
                             "final_val_accuracy": None if bad else v - 0.1 * i,
                             "final_test_accuracy": None if bad else v - 0.1 * i,
                             "wall_time": (2000.0 if m.startswith("async") else 4000.0) + s,
                             "models_sent": 2250 if m == "dp" else 2250 // h,
                             "mean_staleness": float(w - 1)})  # fmt: skip
    return rows


def _folder(root, name, rows, **config):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    (d / "config.json").write_text(json.dumps({"config": {"dataset": "mnist1d", **config}}))


def _assess(root, cid):
    return claims.claim(cid).assess(claims.Context(root, quick=False))


def test_d1_diloco_matches_dp_within_a_point_at_the_largest_h(tmp_path):
    cells = {("dp", 4, 10): _accs(0.85), ("diloco", 4, 10): _accs(0.86),
             ("diloco", 4, 50): _accs(0.845)}  # fmt: skip
    _folder(tmp_path, "diloco", _rows(cells, lrs=(0.5, 0.7, 0.3)))  # 0.5: interior
    v = _assess(tmp_path, "D1")
    assert v.verdict == "held", v.evidence
    assert "diloco (H=50) − dp + 1 point (non-inferiority, margin 1 point) = +0.5" in v.evidence
    assert "models each worker sent: dp 2250, diloco 225 (at H = 10)" in v.evidence
    cells[("diloco", 4, 50)] = _accs(0.82)  # 3 points below dp: beyond the margin
    _folder(tmp_path, "diloco", _rows(cells))
    assert _assess(tmp_path, "D1").verdict == "did not hold"


def test_d2_and_d3_read_the_asynchronous_arms_against_diloco(tmp_path):
    cells = {("diloco", 4, 10): _accs(0.86), ("async-nesterov", 4, 10): _accs(0.40),
             ("async-delayed", 4, 10): _accs(0.858)}  # fmt: skip
    _folder(tmp_path, "diloco", _rows(cells))
    _folder(tmp_path, "diloco-async", _rows({("diloco", 16, 10): _accs(0.85),
                                             ("async-nesterov", 16, 10): _accs(0.2)}))  # fmt: skip
    v = _assess(tmp_path, "D2")
    assert v.verdict == "held", v.evidence
    assert "diloco (M=4, H=10) − async-nesterov = +46.0" in v.evidence
    assert "more workers — for the claim: diloco (M=16) − async-nesterov = +65.0" in v.evidence
    v = _assess(tmp_path, "D3")
    assert v.verdict == "held", v.evidence
    # the margin is 2 % of DiLoCo's 14 % error: 0.28 points; 0.2 points below is inside it
    assert "2 % of diloco's test error here, 0.28 points" in v.evidence
    assert "faster in emulated wall clock" in v.evidence and "= +50.0" in v.evidence
    cells[("async-delayed", 4, 10)] = _accs(0.85)  # 1 point below: beyond 0.28
    _folder(tmp_path, "diloco", _rows(cells))
    assert _assess(tmp_path, "D3").verdict.startswith(
        ("did not hold", "held with reversals", "doubtful")
    )


def test_d4_takes_the_lowest_precision_at_the_largest_overlap(tmp_path):
    cells = {("diloco", 4, 10): _accs(0.86)}
    for base in ("streaming", "streaming-fp8", "streaming-fp4"):
        for tau in (0, 4):
            cells[(f"{base} τ={tau}", 4, 10)] = _accs(0.858)
    cells[("streaming-fp4 τ=4", 4, 10)] = _accs(0.80)
    _folder(tmp_path, "diloco-streaming", _rows(cells))
    v = _assess(tmp_path, "D4")
    assert "**primary**: streaming-fp4 τ=4 − diloco + 1 point" in v.evidence
    assert v.verdict.startswith("did not hold"), v.evidence
    # the set-up check added after the run (merge α = 0) is a secondary, never the primary
    check = {k: _accs(0.859) for k in cells}
    _folder(tmp_path, "diloco-streaming-a0", _rows(check))
    v = _assess(tmp_path, "D4")
    assert v.verdict == "did not hold", v.evidence
    assert "set-up check added after the run: merge α = 0 (diloco-streaming-a0)" in v.evidence
    assert "streaming-fp4 τ=4 (α = 0) − diloco + 1 point" in v.evidence
    cells[("streaming-fp4 τ=4", 4, 10)] = _accs(0.855)
    _folder(tmp_path, "diloco-streaming", _rows(cells))
    assert _assess(tmp_path, "D4").verdict == "held"


def test_d5_is_cgad_against_nesterov_at_the_largest_m_with_a_trend(tmp_path):
    cells = {}
    for w, gain in ((4, 0.01), (8, 0.05), (16, 0.2)):
        cells[("async-nesterov", w, 10)] = _accs(0.8 - gain)
        cells[("async-cgad", w, 10)] = _accs(0.8)
    cells[("async-nesterov", 16, 10)][4] = None  # one seed diverged: chance in ITT
    _folder(tmp_path, "diloco-async", _rows(cells))
    v = _assess(tmp_path, "D5")
    assert v.verdict == "held", v.evidence
    assert "async-cgad (M=16) − async-nesterov (M=16)" in v.evidence
    assert "the gain grows with M" in v.evidence and "per doubling of M" in v.evidence
    assert "mean staleness τ of async-nesterov's arrivals by M: 4: 3.0, 8: 7.0, 16: 15.0" in (
        v.evidence
    )


def test_d7_reads_momentum_look_ahead_against_nesterov_on_diloco_asyncs_seeds(tmp_path):
    cells = {}
    for w in (4, 16):
        cells[("diloco", w, 10)] = _accs(0.75)
        cells[("async-nesterov", w, 10)] = _accs(0.7)
    _folder(tmp_path, "diloco-async", _rows(cells))
    assert _assess(tmp_path, "D7").verdict == "not run"  # its own run is missing
    look = {("async-lookahead", 4, 10): _accs(0.72), ("async-lookahead", 16, 10): _accs(0.78)}
    _folder(tmp_path, "diloco-lookahead", _rows(look))
    v = _assess(tmp_path, "D7")
    assert v.verdict == "held with reversals (reversed: against synchronous DiLoCo)", v.evidence
    assert "async-lookahead (M=16) − async-nesterov (M=16) = +8.0" in v.evidence
    assert "the other M" in v.evidence and "async-lookahead (M=4) − async-nesterov" in v.evidence
    assert "async-lookahead (M=4) − diloco (M=4) = -3.0" in v.evidence
    look[("async-lookahead", 4, 10)] = _accs(0.77)
    _folder(tmp_path, "diloco-lookahead", _rows(look))
    assert _assess(tmp_path, "D7").verdict == "held"
    low = {("async-nesterov", 16, 10): _accs(0.5), ("async-lookahead", 16, 10): _accs(0.45)}
    _folder(tmp_path, "diloco-async-low", _rows(low))
    v = _assess(tmp_path, "D7")
    assert "set-up check added after the run: outer rates 0.01–0.1 (diloco-async-low)" in (
        v.evidence
    )
    assert "async-lookahead (M=16, low grid) − async-nesterov (M=16, low grid) = -5.0" in (
        v.evidence
    )
    # a set-up check never changes the verdict; it is printed beside it whichever way it points
    assert v.verdict == "held" and v.setup.endswith(": 1 of 1 against it"), v.summary
    look[("async-lookahead", 16, 10)] = _accs(0.6)
    _folder(tmp_path, "diloco-lookahead", _rows(look))
    assert _assess(tmp_path, "D7").verdict == "did not hold"


def test_d2_and_d5_read_nesterov_on_the_low_grid_as_a_set_up_check(tmp_path):
    cells = {}
    for w in (4, 16):
        cells[("diloco", w, 10)] = _accs(0.87)
        cells[("async-nesterov", w, 10)] = _accs(0.1)  # at chance on the main grid
        cells[("async-cgad", w, 10)] = _accs(0.75)
    _folder(tmp_path, "diloco-async", _rows(cells))
    _folder(tmp_path, "diloco", _rows({k: v for k, v in cells.items() if k[1] == 4}))
    assert "low grid" not in _assess(tmp_path, "D5").evidence
    low = {("async-nesterov", 4, 10): _accs(0.78), ("async-nesterov", 16, 10): _accs(0.81)}
    _folder(tmp_path, "diloco-async-low", _rows(low))
    d5 = _assess(tmp_path, "D5")
    assert localsgd.LOW_LABEL in d5.evidence
    assert "async-cgad (M=16) − async-nesterov (M=16, low grid) = -6.0" in d5.evidence
    assert d5.verdict == "held", d5.verdict  # the primary held; the check reversed, beside it
    assert (
        d5.summary
        == f"held; {localsgd.LOW_LABEL.replace(' added after the run:', ',')}: 2 of 2 against it"
    )
    d2 = _assess(tmp_path, "D2")
    assert "diloco (M=4) − async-nesterov (M=4, low grid) = +9.0" in d2.evidence


def test_a_claim_without_its_run_is_not_run_and_the_report_lists_them(tmp_path):
    assert _assess(tmp_path, "D1").verdict == "not run"
    text = claims.report(claims.Context(tmp_path, quick=False), tmp_path / "docs" / "claims.md")
    for cid in ("D1", "D2", "D3", "D4", "D5"):
        assert f"[{cid}](#{cid.lower()})" in text
    assert "Expected effect: 1 point (the paper: DiLoCo matches" in text


@pytest.mark.parametrize(
    "name",
    [
        "diloco",
        "diloco-streaming",
        "diloco-streaming-a0",
        "diloco-async",
        "diloco-lookahead",
        "diloco-async-low",
        "diloco-long",
        "diloco-overlap",
    ],
)
def test_the_configurations_resolve_and_their_smoke_versions_too(name):
    run = claims.RUNS[name]
    assert run.config.resolved()["dataset"] == "mnist1d"
    assert run.at(True).resolved()["dataset"] == "digits"
    assert localsgd.MARGIN == 0.01


def test_a_primary_arm_still_at_its_grid_edge_makes_the_verdict_a_bound(tmp_path):
    """The caveat says the primary is a bound; where the edge arm could close the gap (the
    reference, async-nesterov, may do better at a rate not run) the primary is no evidence
    (issue 53, rule 5); an interior selection has none (validation prefers the first rate)."""
    cells = {("diloco", 4, 10): _accs(0.86), ("async-nesterov", 4, 10): _accs(0.40)}
    _folder(tmp_path, "diloco", _rows(cells, lrs=(0.1, 0.3, 0.5)))
    v = _assess(tmp_path, "D2")
    assert v.short == "untestable (arm at its grid's edge)", v.verdict
    assert v.verdict.endswith("reverse it: async-nesterov at its grid's smallest rate)")
    assert v.caveat.startswith("a bound: diloco (M=4, H=10) at its")
    assert "async-nesterov at its grid's smallest rate" in v.summary
    assert "**a bound**" in v.evidence and "@ 0.1 (edge)" in v.tables[0]
    _folder(tmp_path, "diloco", _rows(cells, lrs=(0.3, 0.1, 0.5)))
    v = _assess(tmp_path, "D2")
    assert v.verdict == v.summary == "held" and not v.caveat and "(edge)" not in v.tables[0]


def test_d6_eager_updates_match_diloco_and_beat_the_naive_overlap(tmp_path):
    cells = {("diloco", 4, 10): _accs(0.86), ("diloco-delayed", 4, 10): _accs(0.80),
             ("diloco-eager", 4, 10): _accs(0.857), ("diloco", 4, 50): _accs(0.85),
             ("diloco-delayed", 4, 50): _accs(0.78),
             ("diloco-eager", 4, 50): _accs(0.848)}  # fmt: skip
    _folder(tmp_path, "diloco-overlap", _rows(cells, lrs=(0.7,)))
    v = _assess(tmp_path, "D6")
    assert v.verdict == "held", v.evidence
    assert "diloco-eager (M=4, H=10) − diloco + 1 point (non-inferiority, margin 1 point)" in (
        v.evidence
    )
    assert "eager beats the naive delayed overlap — for the claim" in v.evidence
    assert "what the naive overlap costs: diloco-delayed (M=4, H=10) − diloco = -6.0" in v.evidence
    cells[("diloco-eager", 4, 10)] = _accs(0.83)  # 3 points below DiLoCo: beyond the margin
    _folder(tmp_path, "diloco-overlap", _rows(cells, lrs=(0.7,)))
    assert _assess(tmp_path, "D6").verdict == "did not hold"
    assert _assess(tmp_path / "none", "D6").verdict == "not run"


def test_an_arm_at_chance_at_every_rate_makes_the_verdict_untestable(tmp_path):
    """A tie at chance can leave the selection inside the grid: it is a bound all the same, and
    a primary against an arm no rate trains measures the grid, not the method (issue 53)."""
    cells = {("diloco", 4, 10): _accs(0.86), ("async-nesterov", 4, 10): _accs(0.10)}
    rows = _rows(cells, lrs=(0.3, 0.1, 0.5))
    for r in rows:
        if r["method"] == "async-nesterov":
            r["final_val_accuracy"] = r["final_test_accuracy"] = 0.1 + 0.001 * (r["lr"] == 0.3)
    _folder(tmp_path, "diloco", rows)
    v = _assess(tmp_path, "D2")
    assert v.verdict == "untestable here (an arm of the primary at chance at every rate)"
    assert v.caveat == "a bound: async-nesterov at chance at every rate of its grid", v.caveat


def test_d1_reads_its_set_up_check_on_a_longer_budget_as_a_secondary(tmp_path):
    """The primary stays the configured budget's; the longer budget's contrasts are labelled
    secondaries, named by the multiple of the budget the two configurations record, with their
    own table, and the check's rows alone leave the primary not run."""
    cells = {("dp", 4, 10): _accs(0.85), ("diloco", 4, 10): _accs(0.84),
             ("diloco", 4, 50): _accs(0.82)}  # fmt: skip
    _folder(tmp_path, "diloco", _rows(cells))
    before = _assess(tmp_path, "D1")
    assert "set-up check" not in before.evidence and len(before.tables) == 1
    long = {("dp", 4, 10): _accs(0.90), ("diloco", 4, 10): _accs(0.895),
            ("diloco", 4, 50): _accs(0.885)}  # fmt: skip
    _folder(tmp_path, "diloco-long", _rows(long))
    for name, steps in (("diloco", 2250), ("diloco-long", 6750)):
        cfg = {"dataset": "mnist1d", "steps": steps}
        (tmp_path / name / "config.json").write_text(json.dumps({"config": cfg}))
    v = _assess(tmp_path, "D1")
    assert v.verdict == before.verdict == "did not hold"  # 3 points below dp: the primary's
    label = localsgd.LONG_LABEL.format(times="3×")
    assert f"- {label}: " in v.evidence and "(diloco-long)" in label
    assert "diloco (H=10, 3× budget) − dp (3× budget) + 1 point" in v.evidence
    assert "diloco (H=50, 3× budget) − dp (3× budget) + 1 point (non-inferiority, margin 1 " \
        "point) = -0.5" in v.evidence  # fmt: skip
    assert "plain difference: diloco (H=50, 3× budget) − dp (3× budget) = -1.5" in v.evidence
    assert v.tables[1].startswith("At 3× the budget (diloco-long):\n\n| method |")
    assert "88.5" in v.tables[1] and "90.0" in v.tables[1]
    (tmp_path / "diloco-long" / "config.json").write_text(json.dumps({"config": {}}))
    assert (
        "diloco (H=10, a longer budget) − dp (a longer budget)" in _assess(tmp_path, "D1").evidence
    )
    for steps in (6750, 2250):  # the check's rows at diloco's budget (or below): not a check
        cfg = {"dataset": "mnist1d", "steps": steps}
        (tmp_path / "diloco-long" / "config.json").write_text(json.dumps({"config": cfg}))
        base = {"config": {**cfg, "steps": 6750}}
        (tmp_path / "diloco" / "config.json").write_text(json.dumps(base))
        same = _assess(tmp_path, "D1")
        assert same.verdict == before.verdict and len(same.tables) == 1
        assert "set-up check added" not in same.evidence
        note = f"diloco-long left out: its rows are at {steps / 6750:g}× diloco's budget"
        assert note in same.evidence
    (tmp_path / "diloco" / "summary.json").unlink()
    assert _assess(tmp_path, "D1").verdict == "not run"


def test_a_longer_run_judges_the_reference_of_every_claim_that_reads_the_shorter(tmp_path):
    """dp on AdamW's cosine: diloco-long (a longer budget) ends 3.6 points higher, so
    diloco's reference has not converged — on D1, which reads both, and on D2 and D3, which
    read diloco alone; diloco-long's own reference, with nothing longer, is not judged."""
    from study import budget

    cells = {("dp", 4, 10): _accs(0.85), ("diloco", 4, 10): _accs(0.84),
             ("async-nesterov", 4, 10): _accs(0.6),
             ("async-delayed", 4, 10): _accs(0.8)}  # fmt: skip
    for name, steps, plateau in (("diloco", 2250, 0.873), ("diloco-long", 6750, 0.909)):
        _folder(tmp_path, name, _rows(cells))
        cfg = {"dataset": "mnist1d", "optimizer": "adamw", "inner_lr": 0.003, "steps": steps}
        (tmp_path / name / "config.json").write_text(json.dumps({"config": cfg}))
        fact = {"setting": {"model": "mlp", "method": "dp", "workers": 4, "inner_steps": 10},
                "lr": 8.0, "steps": steps, "plateau": plateau, "flat_since": None,
                "delta_last_third": [0.02, 0.005, 10]}  # fmt: skip
        (tmp_path / name / budget.FILE).write_text(json.dumps([fact]))
    got = claims.assess_all(claims.Context(tmp_path, quick=False))
    note = "reference not converged at the budget of diloco"
    for cid in ("D1", "D2", "D3"):
        assert got[cid].caveat.endswith(note) or f"{note};" in got[cid].caveat, cid
    assert f"{note}, diloco-long" not in got["D1"].caveat  # (the fixture's configs drifted)


def test_the_async_checks_pair_with_diloco_async_only_under_one_set_up(tmp_path):
    cells = {}
    for w in (4, 16):
        cells[("diloco", w, 10)] = _accs(0.87)
        cells[("async-nesterov", w, 10)] = _accs(0.1)
        cells[("async-cgad", w, 10)] = _accs(0.75)
    _folder(tmp_path, "diloco-async", _rows(cells), steps=6750)
    low = {("async-nesterov", 4, 10): _accs(0.78), ("async-nesterov", 16, 10): _accs(0.81)}
    _folder(tmp_path, "diloco-async-low", _rows(low), steps=2250)
    _folder(tmp_path, "diloco-lookahead", _rows({("async-lookahead", 16, 10): _accs(0.8)}),
            steps=2250)  # fmt: skip
    why = "its configuration differs outside methods, lrs, adam_lrs (steps 6750 → 2250)"
    d5 = _assess(tmp_path, "D5")
    assert localsgd.LOW_LABEL not in d5.evidence and "low grid" not in d5.evidence
    assert f"- `diloco-async-low`'s rows not read with `diloco-async`'s: {why}" in d5.evidence
    assert d5.verdict == "held", d5.verdict
    d7 = _assess(tmp_path, "D7")
    assert d7.verdict == "not run" and "async-lookahead (M=16) −" not in d7.evidence
    assert f"- `diloco-lookahead`'s rows not read with `diloco-async`'s: {why}" in d7.evidence
