"""experiments/delay_cliff.py: a tiny grid end to end, stability judged on validation, bad input,
resume."""

import json

import pytest

from experiments import cliff_tables, delay_cliff
from jaxstale import tasks

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
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 for r in rows)  # the group's share each
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
    assert cliff_tables.largest_stable_lr(rows, "asgd", 4, **kw) == 0.01
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
    assert cliff_tables.d0_reference(rows, "a", 0.1) == (pytest.approx(0.97), 0.1)
    stable = cliff_tables.stable_rates(rows, tolerance=0.05, chance_acc=0.1)
    assert stable == {("a", 0): [0.01, 0.1], ("a", 4): [0.01], ("a", 8): [0.001]}
    # swapping the test numbers around changes nothing
    flipped = [{**r, "final_test_accuracy": 1 - (r["final_test_accuracy"] or 0)} for r in rows]
    assert cliff_tables.stable_rates(flipped, tolerance=0.05, chance_acc=0.1) == stable
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
    table, _, selected = cliff_tables.make_table(rows, cfg, 0.1)
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


def _loss_row(method, d, lr, seed, val, test, diverged=False):
    return {
        "method": method,
        "delay": d,
        "lr": lr,
        "seed": seed,
        "final_val_loss": None if diverged else val,
        "final_test_loss": None if diverged else test,
        "diverged": diverged,
        "updates_to_target": None,
    }


def test_a_language_models_cliff_reads_validation_loss_lower_is_better():
    """On a text the reference is the lowest d = 0 validation loss and "stable" is at most
    ``tolerance`` nats above it; a diverged seed counts at log V; tables in nats, no
    paper-rate check (its rates are MNIST's)."""
    task = tasks.language_model(65)
    rows = []
    for s in range(2):
        rows += [
            _loss_row("a", 0, 0.1, s, val=1.50, test=2.9),  # the reference (best on validation)
            _loss_row("a", 0, 0.01, s, val=1.70, test=1.0),  # 0.2 nats above: unstable
            _loss_row("a", 4, 0.1, s, val=1.65, test=1.0),  # 0.15 nats above: unstable
            _loss_row("a", 4, 0.01, s, val=1.55, test=2.0),  # 0.05 nats above: stable
        ]
    rows += [_loss_row("a", 8, 0.01, 0, 1.4, 1.4), _loss_row("a", 8, 0.01, 1, 0, 0, True)]
    kw = {"tolerance": 0.1, "chance_acc": task.chance, "task": task}
    assert cliff_tables.d0_reference(rows, "a", task.chance, task) == (pytest.approx(1.5), 0.1)
    stable = cliff_tables.stable_rates(rows, **kw)
    assert stable == {("a", 0): [0.1], ("a", 4): [0.01], ("a", 8): []}
    assert cliff_tables.largest_stable_lr(rows, "a", 4, **kw) == 0.01
    cfg = {
        "methods": ["asgd", "a"],
        "delays": [0, 4, 8],
        "lrs": [0.01, 0.1],
        "tolerance": 0.1,
        "target": 2.0,
        "momentum": 0.9,
        "model": "gpt-tiny",
        "dataset": "shakespeare",
        "batch_size": 8,
        "steps": 10,
        "seeds": 2,
    }
    table, _, selected = cliff_tables.make_table(rows, cfg, task.chance, task)
    assert "| a | ≥ 0.1: 2.900 ± 0.000 | 0.01: 2.000 ± 0.000 | none |" in table
    assert "a: 1.500 nats at lr 0.1 → stable means ≤ 1.600 nats" in table
    assert "at most 0.1 nats above" in table and "Claim check" not in table
    assert selected[("a", 0)] == 0.1 and selected[("a", 4)] == 0.01
    figs = cliff_tables.make_figures(rows, cfg, stable, task.chance, task)
    assert set(figs) == {"plot", "stable_lr"}


def test_a_texts_defaults_and_tolerance_in_nats():
    cfg = delay_cliff.Config(dataset="shakespeare", quick=True).resolved()
    assert (cfg["model"], cfg["steps"], cfg["tolerance"]) == ("gpt-tiny", 60, 0.1)
    assert delay_cliff.Config(dataset="shakespeare", tolerance=1.5).resolved()["tolerance"] == 1.5
    assert delay_cliff.Config().resolved()["tolerance"] == 0.05  # classification: 5 points


@pytest.mark.slow
def test_a_tiny_text_cliff_end_to_end(tmp_path):
    out = tmp_path / "cliff"
    argv = ["--dataset", "shakespeare", "--model", "gpt-tiny", "--methods", "asgd"]
    argv += ["--delays", "0,2", "--lrs", "0.03,1e30", "--steps", "8", "--seeds", "1"]
    res = delay_cliff.main([*argv, "--extend-edges", "0", "--batch-size", "4", "--out", str(out)])
    by = {(r["delay"], r["lr"]): r for r in res["rows"]}
    assert by[(2, 1e30)]["diverged"] and not by[(0, 0.03)]["diverged"]
    assert 0 < by[(0, 0.03)]["final_val_loss"] < tasks.language_model(83).chance  # 83 chars
    assert by[(2, 0.03)]["max_staleness"] == 2
    assert "test loss (nats)" in res["table"] and "Claim check" not in res["table"]
    assert (out / "plot.png").exists()
