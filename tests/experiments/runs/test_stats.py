"""experiments.runs.stats: intervals against scipy and by hand, selection on validation only."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from experiments.runs import stats


def test_mean_ci_matches_scipy_t_interval():
    vals = [0.91, 0.95, 0.93, 0.97, 0.90]
    m, h, n = stats.mean_ci(vals)
    lo, hi = sps.t.interval(0.95, len(vals) - 1, loc=np.mean(vals), scale=sps.sem(vals))
    assert n == 5 and m == pytest.approx(np.mean(vals))
    assert (m - h, m + h) == pytest.approx((lo, hi))


def test_mean_ci_by_hand_and_edge_cases():
    # n = 2: t_{0.975,1} = 12.7062; s = |a-b|/sqrt(2); half = t * s / sqrt(2) = t * |a-b| / 2
    m, h, n = stats.mean_ci([1.0, 3.0])
    assert (m, n) == (2.0, 2) and h == pytest.approx(12.7062, abs=1e-4)
    assert math.isnan(stats.mean_ci([0.5])[1]) and stats.mean_ci([0.5])[:1] == (0.5,)
    assert stats.mean_ci([None, float("nan")])[2] == 0
    with pytest.raises(ValueError, match="level"):
        stats.mean_ci([1.0, 2.0], level=1.0)


def test_format_ci_shows_diverged_fraction_never_averaged_in():
    assert stats.format_ci([0.97, 0.97, 0.97]) == "97.0 ± 0.0"
    assert stats.format_ci([0.97, None, 0.97]) == "97.0 ± 0.0 [1/3 div.]"
    assert stats.format_ci([0.5]) == "50.0 (1 seed)"
    assert stats.format_ci([None, None]) == "diverged [2/2]"
    assert stats.format_ci([]) == "–"
    # explicit flags: a diverged run may still carry a (chance-level) number
    assert stats.format_ci([0.1, 0.9, 0.9], diverged=[True, False, False]) == (
        "90.0 ± 0.0 [1/3 div.]"
    )
    with pytest.raises(ValueError, match="flags"):
        stats.format_ci([0.1], diverged=[True, False])


def _rows():
    # lr 0.1: higher mean validation accuracy of the seeds that trained, but one diverged;
    # with divergence counted at chance (0.1), lr 0.03 wins: (0.95+0.95+0.95)/3 vs (0.1+0.99+0.99)/3
    out = []
    for lr, vals in ((0.1, (None, 0.99, 0.99)), (0.03, (0.95, 0.95, 0.95))):
        for s, v in enumerate(vals):
            out.append(
                {
                    "method": "m",
                    "workers": 4,
                    "lr": lr,
                    "seed": s,
                    "diverged": v is None,
                    "final_val_accuracy": v,
                    # test accuracy says the opposite: selection must not look at it
                    "final_test_accuracy": None if v is None else 1.0 - v,
                }
            )
    return out


def test_select_counts_divergence_at_chance_and_ignores_test():
    rows = _rows()
    assert stats.select(rows, by=("method", "workers"), chance=0.1) == {("m", 4): 0.03}
    # with diverged seeds scored as perfect (never done), lr 0.1 would win: the score matters
    assert stats.select(rows, by=("method",), chance=1.0) == {("m",): 0.1}
    with pytest.raises(ValueError, match="test data"):
        stats.select(rows, by=("method",), value="final_test_accuracy")


def test_an_exact_tie_goes_to_the_confirmed_value_whatever_the_row_order():
    """At chance level two rates score the same on the tuning seeds; the one confirmed on
    every seed (a two-stage sweep) wins, read in the sweep's order or sorted by rate."""
    row = lambda lr, s, v: {"lr": lr, "seed": s, "final_val_accuracy": v, "diverged": False}
    tuned = [row(0.3, s, v) for s, v in enumerate((0.099, 0.102, 0.1))]
    confirmed = [row(0.3, s, 0.1) for s in range(3, 10)]
    extension = [row(0.18, s, v) for s, v in enumerate((0.099, 0.102, 0.1))]
    sweep_order = tuned + extension + confirmed
    by_rate = sorted(sweep_order, key=lambda r: (r["lr"], r["seed"]))
    for rows in (sweep_order, by_rate):
        assert stats.select(rows, by=(), chance=0.1) == {(): 0.3}
    # before the confirmation, the first seen wins the tie
    assert stats.select(extension + tuned, by=(), chance=0.1) == {(): 0.18}
    assert stats.select(tuned + extension, by=(), chance=0.1) == {(): 0.3}


def test_score_by_hand():
    rows = _rows()[:3]
    assert stats.score(rows, "final_val_accuracy", 0.1) == pytest.approx((0.1 + 0.99 + 0.99) / 3)


def test_tuned_table_reports_test_at_selected_knob():
    body, sel = stats.tuned_table(_rows(), index=("method",), columns="workers", chance=0.1)
    assert sel == {("m", 4): 0.03}
    assert body == [["m", "5.0 ± 0.0 @ 0.03"]]
    body, _ = stats.tuned_table(
        _rows(), index=("method",), columns="workers", fixed={("m", 4): 0.1}
    )
    assert body == [["m", "1.0 ± 0.0 [1/3 div.] @ 0.1"]]


def test_time_to_accuracy_and_format_steps():
    curve = [{"step": 40, "val_accuracy": 0.8}, {"step": 80, "val_accuracy": None},
             {"step": 120, "val_accuracy": 0.96}]  # fmt: skip
    assert stats.time_to_accuracy(curve, 0.95) == 120
    assert stats.time_to_accuracy(curve, 0.97) is None
    assert stats.time_to_accuracy(None, 0.5) is None
    assert stats.format_steps([120, 200, 160]) == "160"
    assert stats.format_steps([120, None]) == "120 [1/2]"
    assert stats.format_steps([None]) == "never [0/1]"
    assert stats.format_steps([]) == "–"


def test_paired_difference_pairs_by_seed_and_drops_diverged():
    a = [{"seed": s, "final_test_accuracy": v, "diverged": v is None}
         for s, v in enumerate([0.95, 0.96, None, 0.97])]  # fmt: skip
    b = [{"seed": s, "final_test_accuracy": v} for s, v in enumerate([0.94, 0.95, 0.5, 0.95])]
    m, h, n = stats.paired_difference(a, b)
    diffs = [0.01, 0.01, 0.02]
    assert n == 3 and m == pytest.approx(np.mean(diffs))
    assert h == pytest.approx(sps.t.ppf(0.975, 2) * np.std(diffs, ddof=1) / np.sqrt(3))
    # order of rows does not matter: pairs are matched by seed
    assert stats.paired_difference(a[::-1], b) == (m, h, n)


def test_a_loss_is_selected_and_timed_lowest_first():
    """final_val_loss: the lowest mean wins, a diverged seed counts at chance (log V)."""
    rows = [
        {"lr": 0.1, "seed": 0, "final_val_loss": 1.5, "diverged": False},
        {"lr": 0.1, "seed": 1, "final_val_loss": None, "diverged": True},
        {"lr": 0.01, "seed": 0, "final_val_loss": 1.9, "diverged": False},
        {"lr": 0.01, "seed": 1, "final_val_loss": 1.9, "diverged": False},
    ]
    assert stats.select(rows, by=(), value="final_val_loss", chance=4.4)[()] == 0.01
    assert stats.select(rows, by=(), value="final_val_loss", chance=2.0)[()] == 0.1
    curve = [{"step": 10, "val_loss": 2.5}, {"step": 20, "val_loss": 1.9}]
    assert stats.time_to_accuracy(curve, 2.0, key="val_loss") == 20
    assert stats.time_to_accuracy(curve, 1.0, key="val_loss") is None


def test_runner_up_is_the_second_best_and_how_far_behind_it_is():
    from experiments.runs.stats import runner_up

    def rows(vals, key="final_val_accuracy"):
        return [{"seed": s, key: v, "diverged": v is None} for s, v in enumerate(vals)]

    per = {0.01: rows([0.80, 0.82]), 0.03: rows([0.90, 0.88]), 0.1: rows([0.85, None])}
    second, gap = runner_up(per, chance=0.1)
    assert second == 0.01 and gap == pytest.approx(0.08)  # 0.1 scores (0.85 + 0.1) / 2
    # a loss: lower is best, the gap still ≥ 0; only the seeds every rate ran count
    per = {0.01: rows([2.0, 2.1, 9.9], "final_val_loss"), 0.03: rows([1.9, 2.0], "final_val_loss")}
    second, gap = runner_up(per, "final_val_loss")
    assert second == 0.01 and gap == pytest.approx(0.1)
    assert runner_up({0.01: rows([0.5])}) is None
    with pytest.raises(ValueError, match="must not use test"):
        runner_up(per, "final_test_loss")
