"""constant_delay: a grid of delays × stale / predicted, rates selected on validation, the
paired tables and the gap prediction closes; bad input refused in one line."""

import json

import pytest

from experiments import constant_delay as exp
from jaxstale import tasks

TINY = ["--dataset", "digits", "--model", "mlp", "--optimizer", "sgd", "--batch-size", "16"]
TINY += ["--steps", "12", "--eval-every", "6", "--seeds", "2", "--lrs", "0.01", "0.03"]
TINY += ["--extend-edges", "0"]


@pytest.mark.slow  # 11 s, three compiled programs; the tables' logic is tested on rows below
def test_delays_and_prediction_end_to_end(tmp_path):
    out = tmp_path / "run"
    res = exp.main([*TINY, "--delays", "0", "2", "--out", str(out)])
    rows = json.loads((out / "summary.json").read_text())["rows"]
    cells = {(r["method"], r["delay"]) for r in rows}
    # predicted at τ = 0 is the optimizer itself: not run twice
    assert cells == {("stale", "0"), ("stale", "2"), ("predicted", "2")}
    assert len(rows) == 3 * 2 * 2 and all("final_val_accuracy" in r for r in rows)
    # each run's share of its group's wall and process CPU time (one group per method and delay)
    for r in rows:
        assert r["cpu_s"] > 0 and r["wall_s"] > 0
        twin = [q for q in rows if (q["method"], q["delay"]) == (r["method"], r["delay"])]
        assert {(q["cpu_s"], q["wall_s"]) for q in twin} == {(r["cpu_s"], r["wall_s"])}
    for (model, method, delay), lr in res["selected"].items():
        pick = [r for r in rows if (r["method"], r["delay"]) == (method, delay)]
        mean = lambda v, pick=pick: sum(r["final_val_accuracy"] for r in pick if r["lr"] == v)
        assert lr == max((0.01, 0.03), key=mean) and model == "mlp"
    table = res["table"]
    assert "| model | method | τ = 0 | τ = 2 |" in table and "predicted − stale" in table
    assert "gap closed by prediction" in table and (out / "plot.png").exists()


@pytest.mark.slow  # 5 compiled programs; the fast test above keeps the uniform delays
def test_a_pipeline_stage_profile_is_a_delay_column(tmp_path):
    res = exp.main([*TINY, "--delays", "0", "--stage-profiles", "3", "--out", str(tmp_path / "r")])
    assert {(r["method"], r["delay"]) for r in res["rows"]} == {
        ("stale", "0"),
        ("stale", "stages-3"),
        ("predicted", "stages-3"),
    }
    assert "τ_s = 3 − 1 − s" in res["table"]


def _row(method, delay, lr, seed, test):
    val = test + (0.0 if lr == 0.003 else 0.5)  # validation prefers 0.003 everywhere
    return {"model": "gpt", "method": method, "delay": delay, "lr": lr, "seed": seed,
            "final_val_loss": val, "final_test_loss": test, "diverged": False,
            "updates_to_target": None}  # fmt: skip


def test_tables_select_on_validation_and_measure_the_gap_prediction_closes():
    # per seed s: τ = 0 ends at 2.0 + s/10, stale τ = 4 0.4 nats above, predicted 0.1 above
    base = {"stale": {"0": 0.0, "4": 0.4}, "predicted": {"4": 0.1}}
    rows = [
        _row(m, d, lr, s, 2.0 + s / 10 + gap + (0.3 if lr == 0.01 else 0.0))
        for m, gaps in base.items()
        for d, gap in gaps.items()
        for lr in (0.003, 0.01)
        for s in range(3)
    ]
    cfg = {"optimizer": "adamw", "momentum": 0.9, "dataset": "shakespeare", "steps": 10,
           "batch_size": 16, "seeds": 3, "target": 2.0, "lrs": [0.003, 0.01]}  # fmt: skip
    task = tasks.language_model(83)
    table, selected, picked = exp.make_table(rows, cfg, task.chance, task)
    assert set(selected.values()) == {0.003} and len(picked) == 9
    assert "| gpt | τ = 4 | +0.400 ± 0.000 (3) | +0.100 ± 0.000 (3) | 75 % |" in table
    assert "| gpt | predicted − stale | **-0.300 ± 0.000** beyond noise |" in table


def test_error_feedback_is_a_method_with_its_own_gap_column():
    """feedback closes half the stale gap here; its column and paired row sit beside
    prediction's (issue 52, LM7)."""
    base = {"stale": {"0": 0.0, "1": 0.4}, "predicted": {"1": 0.1}, "feedback": {"1": 0.2}}
    rows = [
        _row(m, d, 0.003, s, 2.0 + s / 10 + gap)
        for m, gaps in base.items()
        for d, gap in gaps.items()
        for s in range(3)
    ]
    cfg = {"optimizer": "adamw", "momentum": 0.9, "dataset": "shakespeare", "steps": 10,
           "batch_size": 16, "seeds": 3, "target": 2.0, "lrs": [0.003]}  # fmt: skip
    task = tasks.language_model(83)
    table, _, _ = exp.make_table(rows, cfg, task.chance, task)
    assert (
        "| stale − τ=0 | predicted − τ=0 | feedback − τ=0 | gap closed by prediction | "
        "gap closed by error feedback |" in table
    )
    assert (
        "| gpt | τ = 1 | +0.400 ± 0.000 (3) | +0.100 ± 0.000 (3) | +0.200 ± 0.000 (3) | "
        "75 % | 50 % |" in table
    )
    assert "| gpt | feedback − stale | **-0.200 ± 0.000** beyond noise |" in table
    assert exp.Config(quick=True).resolved()["methods"] == ["stale", "predicted"]  # the default


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stage-profiles", "8"], "'mlp' has 3 blocks, fewer than N=8"),
        (["--methods", "predicted", "--delays", "0"], "predicted at τ = 0 is the optimizer"),
        (["--methods", "feedback", "--delays", "0"], "feedback at τ = 0 is the optimizer"),
        (["--delays", "2", "2"], "2 is given twice"),
        (["--optimizer", "lion"], "lion"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        exp.main([*TINY, *argv, "--out", str(out)])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # a GPT's delayed program compiles per (method, delay): ~1 min
def test_quick_runs_a_gpt_with_a_delay(tmp_path):
    res = exp.main(["--quick", "--out", str(tmp_path / "run")])
    rows = res["rows"]
    assert {r["delay"] for r in rows} == {"0", "2"} and all("final_val_loss" in r for r in rows)
    assert "Gap to τ = 0 (nats" in res["table"]


def test_a_batch_whose_activations_cannot_fit_is_one_line(tmp_path, capsys):
    """The backward's saved activations count (--model gpt-gpu --batch-size 4096 asked for
    ~219 GB per run and died in its first step, after 85 s)."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        exp.main(["--model", "gpt-gpu", "--batch-size", "4096", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert "argument --batch-size" in err[0] and "of memory" in err[0]
    assert not out.exists()


def test_an_image_dataset_defaults_to_the_mlp():
    """The GPT default refused --dataset digits / mnist1d (issue 51's budget table)."""
    assert exp.Config(quick=True, dataset="digits").resolved()["models"] == ["mlp"]
    assert exp.Config(quick=True).resolved()["models"] == ["gpt-tiny"]  # shakespeare
