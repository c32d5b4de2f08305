"""experiments/delay_cliff.py: a tiny grid end to end, stability judged on validation, bad input,
resume."""

import json

import pytest

from experiments import delay_cliff

TINY = ["--methods", "asgd,sa-asgd", "--delays", "0,4", "--lrs", "0.01,1e30"]
TINY += ["--steps", "20", "--seeds", "1", "--extend-edges", "0"]  # the grid as given


def test_tiny_grid_end_to_end_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "cliff"
    argv = [*TINY, "--tolerance", "1", "--out", str(out)]
    res = delay_cliff.main(argv)
    for name in ["summary.json", "table.md", "plot.png", "stable_lr.png", "metrics.jsonl"]:
        assert (out / name).exists(), name
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert len(rows) == 2 * 2 * 2
    by = {(r["method"], r["delay"], r["lr"]): r for r in rows}
    bad = by[("asgd", 4, 1e30)]
    assert bad["diverged"] and bad["final_test_accuracy"] is None
    assert bad["final_val_accuracy"] is None
    good = by[("asgd", 0, 0.01)]
    assert not good["diverged"] and 0 <= good["final_val_accuracy"] <= 1
    assert "updates_to_target" in good
    assert by[("asgd", 4, 0.01)]["max_staleness"] == 4 and good["max_staleness"] == 0
    # d = 0 with any τ=0-identity method is plain SGD
    assert by[("sa-asgd", 0, 0.01)]["final_train_loss"] == pytest.approx(
        good["final_train_loss"], rel=1e-6
    )
    # the curves hold both splits
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"val_accuracy", "test_accuracy"} <= set(metrics[0])
    # tolerance 1 (100 points): every rate that did not diverge is stable
    assert res["stable"][("asgd", 0)] == [0.01] and res["stable"][("asgd", 4)] == [0.01]
    kw = {"tolerance": 1.0, "chance_acc": 0.1}
    assert delay_cliff.largest_stable_lr(rows, "asgd", 4, **kw) == 0.01
    assert "Largest stable learning rate" in res["table"]
    assert "Claim check" in res["table"] and "asgd, lr 0.01" in res["table"]
    assert "selected on validation" in res["table"]
    assert "Smoke run" not in res["table"]

    monkeypatch.setattr(delay_cliff, "_run_group", lambda *a: pytest.fail("recomputed"))
    again = delay_cliff.main(argv)
    assert again["rows"] == rows


def _row(method, d, lr, seed, val, test, diverged=False):
    return {
        "method": method,
        "delay": d,
        "lr": lr,
        "seed": seed,
        "final_val_accuracy": None if diverged else val,
        "final_test_accuracy": None if diverged else test,
        "diverged": diverged,
        "updates_to_target": None,
    }


def test_stability_is_judged_on_validation_not_test():
    """The reference (best d = 0) and every stability verdict read validation accuracy only;
    test accuracy that says the opposite changes nothing. A diverged seed makes a rate
    unstable even when the others are fine."""
    rows = []
    for s in range(2):
        rows += [
            _row("a", 0, 0.1, s, val=0.97, test=0.50),  # best at d = 0 on validation
            _row("a", 0, 0.01, s, val=0.95, test=0.99),
            _row("a", 4, 0.1, s, val=0.90, test=0.99),  # 7 points below: unstable
            _row("a", 4, 0.01, s, val=0.96, test=0.20),  # within 5 points: stable
        ]
    rows += [
        _row("a", 8, 0.01, 0, val=0.99, test=0.99),
        _row("a", 8, 0.01, 1, val=None, test=None, diverged=True),
        _row("a", 8, 0.001, 0, val=0.93, test=0.10),
        _row("a", 8, 0.001, 1, val=0.93, test=0.10),
    ]
    assert delay_cliff.d0_reference(rows, "a", 0.1) == (pytest.approx(0.97), 0.1)
    stable = delay_cliff.stable_rates(rows, tolerance=0.05, chance_acc=0.1)
    assert stable == {("a", 0): [0.01, 0.1], ("a", 4): [0.01], ("a", 8): [0.001]}
    # swapping the test numbers around changes nothing
    flipped = [{**r, "final_test_accuracy": 1 - (r["final_test_accuracy"] or 0)} for r in rows]
    assert delay_cliff.stable_rates(flipped, tolerance=0.05, chance_acc=0.1) == stable
    cfg = {
        "methods": ["a"],
        "delays": [0, 4, 8],
        "lrs": [0.001, 0.01, 0.1],
        "tolerance": 0.05,
        "target": 0.95,
        "momentum": 0.9,
        "model": "mlp",
        "dataset": "digits",
        "batch_size": 32,
        "steps": 10,
        "seeds": 2,
    }
    table, _, selected = delay_cliff.make_table(rows, cfg, 0.1)
    # the table reports the test accuracy at the stable rate: 20 % at d = 4
    assert "| a | ≥ 0.1: 50.0 ± 0.0 | 0.01: 20.0 ± 0.0 | 0.001: 10.0 ± 0.0 |" in table
    # the rate selected per (method, d) is the validation one, not the test one
    assert selected[("a", 0)] == 0.1 and selected[("a", 4)] == 0.01


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--delays", "2,4"], "must include 0"),
        (["--delays", "0,-1"], "--delays"),
        (["--lrs=-0.1"], "--lrs"),
        (["--methods", "asgd,nope"], "unknown method 'nope'"),
        (["--tolerance", "2"], "--tolerance"),
        (["--model", "nope"], "--model"),
        (["--momentum", "1"], "--momentum"),
    ],
)
def test_bad_input_is_a_usage_error_before_anything_is_written(tmp_path, capsys, bad, message):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        delay_cliff.main([*TINY, *bad, "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert not out.exists()
