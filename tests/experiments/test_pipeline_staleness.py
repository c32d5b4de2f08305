"""experiments/pipeline_staleness.py on tiny configurations: outputs, selection on validation,
paired differences, divergence, bad input, resume, mesh parity, Adam, registered policies."""

import json

import pytest

from experiments import common, reports
from experiments import pipeline_staleness as exp
from experiments.config import ConfigError
from jaxstale import pipeline, schedules
from jaxstale.pipeline import Policy, register_policy

TINY = ["--model", "mlp", "--stages", "2", "--seeds", "1", "--steps", "16", "--lrs", "0.01"]
TINY += ["--extend-edges", "0"]  # the grid as given (test_grid_edges tests the extension)


def test_end_to_end_files_rows_and_resume(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    drawn = []  # the schedules the Gantt charts draw: the run's own depth (N = 4 before)
    render = exp.schedules.render
    monkeypatch.setattr(exp.schedules, "render", lambda s, **k: drawn.append(s) or render(s, **k))
    argv = [*TINY, "--seeds", "2", "--lrs", "0.003,0.01", "--methods", "sync,vanilla"]
    argv += ["--out", str(out)]
    res = exp.main(argv)
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {(r["method"], r["lr"], r["seed"]) for r in rows} == {
        (m, lr, s) for m in ("sync", "vanilla") for lr in (0.003, 0.01) for s in (0, 1)
    }
    for r in rows:
        assert r["stages"] == 2 and r["model"] == "mlp" and r["optimizer"] == "sgd"
        assert r["diverged"] is False and 0.0 <= r["final_test_accuracy"] <= 1.0
        assert 0.0 <= r["final_val_accuracy"] <= 1.0 and "updates_to_target" in r
        assert r["target"] == "sequential" and r["backward"] == "saved"
    assert {r["schedule"] for r in rows} == {"1f1b"}
    for name in ("table.md", "plot.png", "accuracy_vs_stages.png", "gantt.png", "metrics.jsonl"):
        assert (out / name).exists(), name
    assert drawn and {s.num_stages for s in drawn} == {2}
    # the curves record validation and test accuracy
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"step", "train_loss", "val_accuracy", "test_accuracy"} <= set(rec)
    table = (out / "table.md").read_text()
    assert "Test accuracy % at each policy's learning rate selected on validation" in table
    assert table.count("| mlp | vanilla |") == 3  # accuracy, time to target, validation grid
    assert "| mlp | vanilla | N=2 |" in table  # the validation grid
    assert "| mlp | vanilla − sync |" in table and "| mlp | sync − vanilla |" in table
    assert "beyond noise" in table and "Smoke run" not in table
    assert "CPU" not in table  # timings are printed, not tabled: a resume writes the same bytes
    assert res["cpu_s"] > 0
    capsys.readouterr()
    # same config, same folder: nothing is recomputed
    monkeypatch.setattr(exp._Runner, "group", lambda *a: pytest.fail("recomputed"))
    again = exp.main(argv)
    assert "resuming" in capsys.readouterr().err
    assert again["rows"] == res["rows"] and again["table"] == res["table"]


def test_rate_is_selected_on_validation_never_on_test():
    """The rate with the better validation score wins even where its test accuracy is worse,
    and the table reports the test accuracy of that rate; diverged seeds count at chance."""

    def row(method, lr, seed, val, test, diverged=False):
        return {"model": "mlp", "stages": 4, "method": method, "lr": lr, "seed": seed,
                "final_val_accuracy": None if diverged else val,
                "final_test_accuracy": None if diverged else test, "diverged": diverged,
                "updates_to_target": None}  # fmt: skip

    rows = []
    for s in range(3):
        rows += [row("vanilla", 0.01, s, 0.96, 0.90), row("vanilla", 0.03, s, 0.95, 0.99)]
        # stash: 0.03 has the best trained seeds but one diverged (chance 0.1) -> 0.01
        rows += [row("stash", 0.01, s, 0.93, 0.93 + 0.002 * s)]
        rows += [row("stash", 0.03, s, 0.99, 0.99, diverged=s == 0)]
    cfg = {"dataset": "digits", "optimizer": "sgd", "momentum": 0.9, "steps": 10,
           "batch_size": 32, "backward": "saved", "seeds": 3, "target": 0.95}  # fmt: skip
    table, selected = exp.make_table(rows, cfg, 0.1)
    assert selected == {("mlp", "vanilla", 4): 0.01, ("mlp", "stash", 4): 0.01}
    assert "| mlp | vanilla | 90.0 ± 0.0 @ 0.01 |" in table
    assert "| mlp | stash | 93.2 ± 0.5 @ 0.01 |" in table
    # stash − vanilla at the selected rates: +3.0, +3.2, +3.4 points
    assert "| mlp | stash − vanilla | **+3.2 ± 0.5** beyond noise |" in table
    assert "mlp, N=4: beyond noise: stash > vanilla by 3.2 ± 0.5" in table
    picked = reports.at_selected(rows, selected, by=("model", "method", "stages"))
    assert len(picked) == 6 and {r["lr"] for r in picked} == {0.01}


def test_paired_table_needs_three_pairs_and_counts_diverged_seeds_out():
    def rows(method, values):
        return [
            {"model": "m", "method": method, "stages": 2, "seed": s, "final_test_accuracy": v,
             "diverged": v is None}
            for s, v in enumerate(values)
        ]  # fmt: skip

    base = rows("a", [0.90, 0.91, 0.92, 0.93])
    two = rows("b", [0.95, 0.96, None, None])  # identical differences on two seeds: width 0
    three = rows("c", [0.95, 0.96, 0.97, None])
    table, findings = reports.paired_table(
        base + two + three, index=("model",), compare="method", baseline="a", columns="stages"
    )
    by = {f["a"]: f for f in findings}
    assert by["b"]["n"] == 2 and not by["b"]["beyond"]
    assert by["c"]["n"] == 3 and by["c"]["beyond"]
    assert "+5.0 ± 0.0 (2/4 pairs)" in table and "**+5.0 ± 0.0** beyond noise (3/4 pairs)" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stages", "2,x"], "argument --stages"),
        (["--stages", "0"], "argument --stages"),
        (["--methods", "nope"], "unknown policy 'nope'"),
        (["--lrs", "-0.1"], "argument --lrs"),
        (["--momentum", "1"], "argument --momentum"),
        (["--optimizer", "rmsprop"], "argument --optimizer"),
        (["--model", "foo"], "unknown model 'foo'"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--model", "cnn", "--stages", "8"], "has 5 blocks, fewer than N=8 stages"),
        (["--model", "mlp,cnn", "--stages", "8"], "has 5 blocks, fewer than N=8 stages"),
        (["--model", "cnn", "--mlp-width", "128"], "argument --mlp-width: applies to --model mlp"),
        (["--mlp-width", "0"], "argument --mlp-width"),
        (["--tune-seeds", "3", "--seeds", "2"], "argument --tune-seeds: expected at most"),
    ],
)
def test_bad_input_is_a_usage_error_before_anything_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        exp.main([*argv, "--out", str(out)])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_mlp_width_is_the_models_and_leaves_default_run_ids_alone():
    assert exp.Config().resolved()["model_kw"] == {"mlp": {"hidden": (64,) * 7}}  # as before
    wide = exp.Config(mlp_width=128, model=("mlp", "cnn")).resolved()["model_kw"]
    assert wide == {"mlp": {"hidden": (128,) * 7}, "cnn": {}}


@pytest.mark.slow  # make test: under its 8-minute budget
def test_divergence_is_recorded_and_the_sweep_goes_on(tmp_path):
    argv = [*TINY, "--lrs", "1e4,0.01", "--methods", "vanilla", "--out", str(tmp_path)]
    res = exp.main(argv)
    by_lr = {r["lr"]: r for r in res["rows"]}
    assert by_lr[1e4]["diverged"] is True and by_lr[1e4]["final_test_accuracy"] is None
    assert by_lr[1e4]["diverged_step"] is not None
    assert by_lr[0.01]["diverged"] is False
    assert res["selected"] == {("mlp", "vanilla", 2): 0.01}
    assert "[1/1 div.]" in res["table"]  # the validation grid shows the diverged rate


@pytest.mark.slow  # long end to end; `make test-slow`
def test_quick_is_marked_a_smoke_run(tmp_path):
    res = exp.main(["--quick", *TINY, "--methods", "vanilla", "--out", str(tmp_path)])
    assert common.SMOKE in res["table"]
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 for r in res["rows"])  # timing shares


@pytest.mark.slow  # long: compiles many executables; `make test-slow`
def test_mesh_executor_agrees_with_emulator(tmp_path):
    """--executor mesh (one device per stage, one run at a time) gives the lanes' results."""
    argv = [*TINY, "--steps", "12", "--methods", "vanilla,nesterov"]
    emu = exp.main([*argv, "--out", str(tmp_path / "emu")])["rows"]
    mesh = exp.main([*argv, "--executor", "mesh", "--out", str(tmp_path / "mesh")])["rows"]
    by = lambda rows: {r["method"]: r for r in rows}
    emu, mesh = by(emu), by(mesh)
    assert emu.keys() == mesh.keys() == {"vanilla", "nesterov"}
    for m in emu:
        assert emu[m]["final_test_accuracy"] == pytest.approx(mesh[m]["final_test_accuracy"])
        assert emu[m]["final_train_loss"] == pytest.approx(mesh[m]["final_train_loss"], abs=1e-5)


@pytest.mark.slow  # long end to end; `make test-slow`
def test_adam_runs_every_prediction_rule(tmp_path):
    argv = [*TINY, "--optimizer", "adam", "--lrs", "0.001", "--methods", "spectrain-v1,nesterov"]
    res = exp.main([*argv, "--out", str(tmp_path)])
    assert {r["optimizer"] for r in res["rows"]} == {"adam"}
    assert not any(r["diverged"] for r in res["rows"])
    loss = {r["method"]: r["final_train_loss"] for r in res["rows"]}
    assert loss["spectrain-v1"] != loss["nesterov"]
    assert "Adam (β1 0.9)" in res["table"]


@pytest.mark.slow  # long: compiles many executables; `make test-slow`
def test_sequential_lanes_equal_vmapped_lanes(tmp_path):
    """--seed-mode sequential (how conv models run on a CPU) gives the vmapped lanes' rows."""
    argv = [*TINY, "--seeds", "2", "--methods", "spectrain-v2"]
    a = exp.main([*argv, "--out", str(tmp_path / "vmap")])["rows"]
    b = exp.main([*argv, "--seed-mode", "sequential", "--out", str(tmp_path / "seq")])["rows"]
    for x, y in zip(a, b, strict=True):
        assert x["seed"] == y["seed"]
        assert x["final_train_loss"] == pytest.approx(y["final_train_loss"], rel=1e-5)


@pytest.mark.slow  # long end to end; `make test-slow`
def test_registered_policy_with_its_own_schedule(tmp_path, monkeypatch):
    """A policy registered at run time runs by name, with a schedule factory of its own."""
    register_policy(Policy("stash-seq-test", stash=True), overwrite=True)
    monkeypatch.setitem(pipeline.POLICIES, "stash-seq-test", pipeline.POLICIES["stash-seq-test"])
    calls = []

    def my_schedule(n, nb):
        calls.append((n, nb))
        return schedules.one_f_one_b(n, nb)

    monkeypatch.setitem(exp.SCHEDULES, "stash-seq-test", my_schedule)
    res = exp.main([*TINY, "--methods", "stash,stash-seq-test", "--out", str(tmp_path)])
    by = {r["method"]: r for r in res["rows"]}
    assert (2, 16) in calls
    # the same arithmetic as the built-in stash
    assert by["stash-seq-test"]["final_train_loss"] == by["stash"]["final_train_loss"]
    config = json.loads((tmp_path / "config.json").read_text())["config"]
    assert config["policies"]["stash-seq-test"]["stash"] is True
    assert config["schedules"]["stash-seq-test"].endswith("my_schedule")
    assert config["schedules"]["stash"] == "jaxstale.schedules.timeline.one_f_one_b"
    assert (tmp_path / "gantt_stash-seq-test.png").exists()


def test_asyncpp_momentum_rule_is_configured_per_stage_and_refused_where_ignored(tmp_path):
    assert "momentum_rule" not in exp.Config().resolved()  # default run ids unchanged
    cfg = exp.Config(optimizer="nadam", momentum_rule="asyncpp").resolved()
    assert cfg["momentum_rule"] == "asyncpp"
    with pytest.raises(ConfigError, match="needs an Adam-family optimizer"):
        exp.Config(momentum_rule="asyncpp")  # SGD: no β1 to set per stage
    mesh = exp.Config(optimizer="adam", executor="mesh", momentum_rule="asyncpp").resolved()
    assert mesh["momentum_rule"] == "asyncpp"  # the mesh sets it through stage_trees


@pytest.mark.slow  # two sweeps (8 s)
def test_asyncpp_momentum_rule_changes_the_runs(tmp_path):
    argv = [*TINY, "--optimizer", "nadam", "--lrs", "0.001", "--methods", "stash"]
    const = exp.main([*argv, "--out", str(tmp_path / "c")])["rows"]
    rule = exp.main([*argv, "--momentum-rule", "asyncpp", "--out", str(tmp_path / "a")])["rows"]
    assert const[0]["final_train_loss"] != rule[0]["final_train_loss"]
