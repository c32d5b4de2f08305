"""experiments/sync_baseline.py: a tiny config end to end and resumed, selection on validation,
the convergence evidence, bad input."""

import json

import pytest

from experiments import common, sync_baseline
from experiments.runs.groups import TIMING_FIELDS
from jaxstale import train

ARGS = ["--quick", "--steps", "6", "--eval-every", "3", "--seeds", "2", "--lrs", "0.05"]


def test_end_to_end_and_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    res = sync_baseline.main([*ARGS, "--out", str(out)])
    printed = capsys.readouterr().out
    assert res["run"].path == out
    for name in ("config.json", "metrics.jsonl", "summary.json", "table.md", "plot.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG"

    config = json.loads((out / "config.json").read_text())
    assert config["experiment"] == "sync_baseline"
    cfg = config["config"]
    assert cfg["models"] == ["mlp", "cnn"] and cfg["steps"] == 6 and cfg["batch_size"] == 32

    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert [(r["model"], r["lr"], r["seed"]) for r in rows] == [
        ("cnn", 0.05, 0),
        ("cnn", 0.05, 1),
        ("mlp", 0.05, 0),
        ("mlp", 0.05, 1),
    ]  # sorted by key
    for r in rows:
        assert r["method"] == "sgd" and r["steps"] == 6 and r["batch_size"] == 32
        assert r["diverged"] is False and r["diverged_step"] is None
        assert 0.0 <= r["final_test_accuracy"] <= 1.0
        assert 0.0 <= r["final_val_accuracy"] <= 1.0
        assert "updates_to_target" in r
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 4 * 2  # 4 cells x evaluations at steps 3 and 6
    assert {m["step"] for m in metrics} == {3, 6}
    assert {"model", "lr", "seed", "train_loss", "val_accuracy", "test_accuracy"} <= set(metrics[0])

    table = (out / "table.md").read_text()
    assert table.startswith("**Smoke run (--quick)")
    assert "- sync MLP reaches **" in table and "- sync CNN reaches **" in table
    assert "at lr 0.05 (selected on validation)" in table
    assert "| mlp | 0.05 |" in table and "| cnn | 0.05 |" in table
    assert "sync MLP reaches" in printed and str(out / "table.md") in printed

    # Resume: the same config again trains nothing and writes the same summary.
    calls = []
    real_fit = train.fit
    monkeypatch.setattr(train, "fit", lambda *a, **k: calls.append(a) or real_fit(*a, **k))
    sync_baseline.main([*ARGS, "--out", str(out)])
    assert calls == []
    assert json.loads((out / "summary.json").read_text())["rows"] == rows

    # An interrupted run (one cell missing) re-trains that cell's group, the seeds a fresh run
    # trains with it (its vmapped lanes), and records the missing cell: the same rows, bit for bit.
    key = {"method": "sgd", "model": "mlp", "lr": 0.05, "seed": 1}
    table = (out / "table.md").read_bytes()
    res["run"]._cell_path(key).unlink()
    monkeypatch.setattr(train, "fit", lambda *a, **k: calls.append(k["seeds"]) or real_fit(*a, **k))
    sync_baseline.main([*ARGS, "--out", str(out)])
    assert calls == [[0, 1]]
    again = json.loads((out / "summary.json").read_text())["rows"]
    drop = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]
    assert drop(again) == drop(rows)
    assert (out / "table.md").read_bytes() == table


def _curve(vals, every=10):
    return [{"step": every * (i + 1), "val_accuracy": v} for i, v in enumerate(vals)]


def test_selection_on_validation_and_the_reference_sentence():
    """The rate is the one with the best validation accuracy (a diverged seed at chance), the
    sentence reports the test accuracy there, and the curve evidence is read on validation."""
    cfg = {
        "quick": False,
        "dataset": "digits",
        "models": ["mlp"],
        "lrs": [0.01, 0.1, 0.3],
        "seeds": 2,
        "steps": 60,
        "batch_size": 32,
        "eval_every": 10,
        "momentum": 0.9,
        "target": 0.95,
        "flat_tol": 0.01,
    }

    def row(lr, seed, val, test, diverged=False):
        return {
            "method": "sgd",
            "model": "mlp",
            "lr": lr,
            "seed": seed,
            "final_val_accuracy": val,
            "final_test_accuracy": test,
            "diverged": diverged,
            "updates_to_target": 40,
        }

    rows = [
        row(0.01, 0, 0.96, 0.90),
        row(0.01, 1, 0.96, 0.92),  # best on validation
        row(0.1, 0, 0.94, 0.99),
        row(0.1, 1, 0.94, 0.99),  # best on test: not chosen
        row(0.3, 0, 0.99, 0.99),
        row(0.3, 1, None, None, diverged=True),  # (0.99 + chance) / 2: not chosen
    ]
    flat = _curve([0.5, 0.9, 0.95, 0.96, 0.96, 0.96])
    table, selected, ref = sync_baseline.summarise(rows, cfg, lambda m, lr: [flat, flat], 0.1)
    assert selected == {("mlp",): 0.01}
    assert "sync MLP reaches **91.0 ± 12.7 % test** at lr 0.01 (selected on validation), " in table
    assert "flat since step 30" in table and "+0.00 ± 0.00 points" in table
    assert ref["mlp"]["convergence"]["flat_since"] == 30
    assert "**96.0**" in table  # the validation grid marks the selected rate


def test_convergence_flat_rising_and_diverged():
    flat = common.convergence([_curve([0.5, 0.9, 0.95, 0.96, 0.95, 0.96])] * 2)
    assert flat["flat_since"] == 30 and flat["seeds"] == 2
    assert flat["delta_last_third"][0] == pytest.approx(0.0)
    rising = common.convergence([_curve([0.5, 0.6, 0.7, 0.8, 0.9, 0.95])] * 2)
    assert rising["flat_since"] is None  # the last point is 2.5 points above the plateau
    assert rising["delta_last_third"][0] == pytest.approx(0.15)
    diverged = [{"step": 10, "val_accuracy": 0.5}, {"step": 20, "val_accuracy": None}]
    assert common.convergence([diverged])["seeds"] == 0
    assert common.convergence([_curve([0.9, 0.9]), diverged])["seeds"] == 1


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--lrs", "0"], "--lrs"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--batch-size", "0"], "--batch-size"),
        (["--batch-size", "100000"], "exceeds"),
        (["--flat-tol", "0"], "--flat-tol"),
        (["--target", "1.5"], "--target"),
        (["--dataset", "nope"], "nope"),
        (["--dataset", "shakespeare", "--model", "mlp"], "--model"),
        (["--optimizer", "lion"], "--optimizer"),
    ],
)
def test_bad_input_is_a_usage_error_before_anything_is_written(tmp_path, capsys, bad, message):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        sync_baseline.main([*ARGS, *bad, "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow  # 10 s of GPT compiles; the text's tables stay in make test (hand-built rows)
def test_language_model_end_to_end(tmp_path):
    """--dataset shakespeare: a GPT with the language-model AdamW, rows and curves in nats, the
    sentence beside the corpus's n-gram levels and the uniform loss."""
    out = tmp_path / "lm"
    res = sync_baseline.main(
        ["--dataset", "shakespeare", "--quick", "--steps", "6", "--eval-every", "3",
         "--seeds", "1", "--lrs", "0.003", "--out", str(out)]
    )  # fmt: skip
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert (cfg["models"], cfg["optimizer"], cfg["batch_size"]) == (["gpt-tiny"], "adamw", 16)
    (row,) = res["rows"]
    assert row["method"] == "adamw" and "final_val_accuracy" not in row
    assert 0 < row["final_val_loss"] < 4.42 and row["final_test_loss"] > 0  # below log 83
    levels = "(n-gram levels: unigram 3.289, bigram 2.569, trigram 1.974; uniform 4.419 nats)"
    assert f"nats test** {levels}" in res["table"]
    assert "| test loss (nats) | val. loss (nats) | updates to val. loss 2 |" in res["table"]
    curve = res["run"].metrics({k: row[k] for k in sync_baseline.KEY})
    assert [set(c) >= {"val_loss", "test_loss"} for c in curve] == [True, True]


def test_language_model_selection_and_unlearned_runs():
    """Lower is better: the rate with the lowest validation loss is chosen; a run not below
    log V is diverged (fit_grid's rows, common.loss_fields)."""
    from jaxstale import tasks

    task = tasks.language_model(83)
    cfg = {
        **{"models": ["gpt-cpu"], "lrs": [0.001, 0.003], "seeds": 2, "steps": 60},
        **{"batch_size": 16, "eval_every": 10, "momentum": 0.9, "target": 2.0},
        **{"flat_tol": 0.01, "optimizer": "adamw", "dataset": "shakespeare", "quick": False},
    }
    rows = [
        {"method": "adamw", "model": "gpt-cpu", "lr": lr, "seed": seed, "diverged": False,
         "final_val_loss": v, "final_test_loss": v + 0.01}
        for lr, v in ((0.001, 2.1), (0.003, 1.9))
        for seed in (0, 1)
    ]  # fmt: skip
    curve = [
        {"step": 10 * (i + 1), "val_loss": v, "train_loss": v}
        for i, v in enumerate([3, 2.2, 2.0, 2.0])
    ]
    table, selected, _ = sync_baseline.summarise(
        rows, cfg, lambda m, lr: [curve, curve], task.chance, task, {"bigram": 2.5, "uniform": 4.4}
    )
    assert selected == {("gpt-cpu",): 0.003}
    assert (
        "GPT-CPU reaches **1.910 ± 0.000 nats test** (n-gram levels: bigram 2.500; uniform 4.419"
        in table
    )
    got = common.loss_fields(4.5, 4.6, False, None, curve, 2.0, task)
    assert got["diverged"] and got["final_val_loss"] is None and got["unlearned_val_loss"] == 4.5


def test_mnist1d_defaults_to_the_1d_convolution():
    """The image default (mlp, cnn) refused MNIST-1D's (40, 1) signals (issue 51)."""
    from experiments import sync_baseline

    assert sync_baseline.Config(quick=True, dataset="mnist1d").resolved()["models"] == [
        "mlp", "cnn1d"
    ]  # fmt: skip
    assert sync_baseline.Config(quick=True).resolved()["models"] == ["mlp", "cnn"]
