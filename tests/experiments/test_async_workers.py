"""experiments/async_workers.py end to end on a tiny config: files, resume, divergence, plug-ins."""

import json

import jax
import optax
import pytest

from experiments import async_workers
from experiments.config import ConfigError
from experiments.runs.groups import TIMING_FIELDS
from jaxstale.asyncdp import register_method

TINY = ["--steps", "24", "--seeds", "1", "--workers", "1,4", "--momentum", "0.9"]
TINY += ["--batch-size", "16", "--extend-edges", "0"]  # the grid as given (test_grid_edges)


def test_end_to_end_files_rows_and_resume(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = [*TINY, "--methods", "sgd,ssgd,asgd", "--lrs", "0.01,0.03", "--out", str(out)]
    res = async_workers.main(argv)
    for name in [
        "summary.json",
        "table.md",
        "plot.png",
        "accuracy_vs_workers.png",
        "staleness_hist.png",
        "staleness.json",
        "metrics.jsonl",
        "config.json",
    ]:
        assert (out / name).exists(), name
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {(r["method"], r["workers"]) for r in rows} == {
        ("sgd", 1),
        ("ssgd", 1),
        ("ssgd", 4),
        ("asgd", 1),
        ("asgd", 4),
    }
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 for r in rows)  # the group's share each
    for r in rows:
        for k in [
            "lr",
            "seed",
            "momentum",
            "delay",
            "final_test_accuracy",
            "final_val_accuracy",
            "updates_to_target",
            "diverged",
            "diverged_step",
            "mean_staleness",
            "staleness_counts",
        ]:
            assert k in r
    asgd4 = next(r for r in rows if r["method"] == "asgd" and r["workers"] == 4)
    ssgd4 = next(r for r in rows if r["method"] == "ssgd" and r["workers"] == 4)
    assert asgd4["updates"] == 24 and ssgd4["updates"] == 6  # equal samples
    assert asgd4["mean_staleness"] > 1 and ssgd4["mean_staleness"] == 0
    assert sum(asgd4["staleness_counts"]) == 24
    printed = capsys.readouterr().out
    assert "| method | M=1 | M=4 |" in printed and "plot.png" in printed
    assert res["table"].count("| sgd |") == 3  # accuracy, time to target, validation grid
    assert "Test accuracy % at each method's learning rate selected on validation" in printed

    # resume: nothing is recomputed
    monkeypatch.setattr(async_workers, "_run_group", lambda *a: pytest.fail("recomputed"))
    again = async_workers.main(argv)
    assert len(again["rows"]) == len(rows)


@pytest.mark.slow  # 5 s; pipeline_staleness keeps a divergence row in make test
def test_divergence_is_a_row_not_a_crash(tmp_path):
    out = tmp_path / "div"
    res = async_workers.main([*TINY, "--methods", "sgd,asgd", "--lrs", "1e30", "--out", str(out)])
    assert all(r["diverged"] for r in res["rows"])
    assert all(r["final_test_accuracy"] is None for r in res["rows"])
    assert "diverged" in res["table"]


# The "prototype your own method" tutorial (docs/tutorials/your-method.md; keep the two in sync).
@pytest.mark.slow  # long end to end; `make test-slow`
def test_user_method_plugs_in_without_editing_the_package(tmp_path):
    def staleness_damping(c=0.5):
        """Divide a gradient with staleness τ by 1 + c·τ (reads the emulator's extra args)."""

        def init(params):
            return optax.EmptyState()

        def update(grads, state, params=None, *, staleness, stale_params=None, **extra):
            return jax.tree.map(lambda g: g / (1 + c * staleness), grads), state

        return optax.GradientTransformationExtraArgs(init, update)

    register_method(
        "damped-asgd",
        lambda hp: optax.chain(staleness_damping(), optax.sgd(hp.learning_rate, hp.momentum)),
        overwrite=True,
    )
    res = async_workers.main(
        [*TINY, "--methods", "asgd,damped-asgd", "--out", str(tmp_path / "mine")]
    )
    mine = {r["workers"]: r for r in res["rows"] if r["method"] == "damped-asgd"}
    base = {r["workers"]: r for r in res["rows"] if r["method"] == "asgd"}
    assert set(mine) == {1, 4}
    # τ = 0 with one worker: the same run as ASGD; with 4 workers the damping changes it
    assert mine[1]["final_train_loss"] == pytest.approx(base[1]["final_train_loss"], rel=1e-5)
    assert mine[4]["final_train_loss"] != base[4]["final_train_loss"]
    assert "damped-asgd" in res["table"]


def test_unknown_method_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        async_workers.main([*TINY, "--methods", "nope"])
    assert e.value.code == 2 and "unknown method 'nope'" in capsys.readouterr().err


@pytest.mark.slow  # long end to end; `make test-slow`
def test_rate_is_selected_on_validation_and_reported_on_test(tmp_path):
    """Two rates, two seeds: the table reports the test accuracy of the rate with the best mean
    validation accuracy; LC-ASGD's λ is tuned jointly with it, both signs."""
    argv = [*TINY, "--seeds", "2", "--workers", "4", "--lrs", "0.001,0.05"]
    res = async_workers.main(
        [*argv, "--methods", "asgd,lc-asgd", "--lc-lambdas=-0.1,0.1", "--out", str(tmp_path)]
    )
    rows = res["rows"]
    lc = {(r["lr"], r["lam"]) for r in rows if r["method"] == "lc-asgd"}
    assert lc == {(0.001, -0.1), (0.001, 0.1), (0.05, -0.1), (0.05, 0.1)}
    for method in ("asgd", "lc-asgd"):
        mine = [r for r in rows if r["method"] == method]
        knobs = sorted({(r["lr"], r["lam"]) for r in mine}, key=str)
        val = {
            k: sum(
                0.1 if r["diverged"] else r["final_val_accuracy"]
                for r in mine
                if (r["lr"], r["lam"]) == k
            )
            for k in knobs
        }
        assert val[res["selected"][(method, 4, 0.9)]] == max(val.values())
    assert "@ 0.001" in res["table"] or "@ 0.05" in res["table"]


@pytest.mark.slow  # long: compiles many executables; `make test-slow`
def test_mesh_executor_agrees_with_emulator(tmp_path):
    """--executor mesh (workers on a 'data' device axis) gives the emulator's results."""
    argv = [*TINY, "--methods", "asgd,dc-asgd-a"]
    emu = async_workers.main([*argv, "--out", str(tmp_path / "emu")])["rows"]
    mesh = async_workers.main([*argv, "--executor", "mesh", "--out", str(tmp_path / "mesh")])[
        "rows"
    ]
    key = lambda r: (r["method"], r["workers"], r["seed"])
    emu, mesh = sorted(emu, key=key), sorted(mesh, key=key)
    assert [key(r) for r in emu] == [key(r) for r in mesh]
    for a, b in zip(emu, mesh, strict=True):
        assert a["final_test_accuracy"] == pytest.approx(b["final_test_accuracy"], abs=1e-6)
        assert a["mean_staleness"] == b["mean_staleness"]


@pytest.mark.slow  # long end to end; `make test-slow`
def test_paper_preset_on_mock_cifar10_prints_the_papers_numbers(tmp_path, no_network):
    """--preset wiring only (shapes, flags, the paper column), on tfds mock data."""
    import tensorflow_datasets as tfds

    argv = ["--preset", "dc-asgd-cifar10", "--steps", "4", "--seeds", "1", "--workers", "4"]
    argv += ["--batch-size", "4", "--lrs", "0.1", "--model", "mlp", "--out", str(tmp_path)]
    with tfds.testing.mock_data(num_examples=40):
        res = async_workers.main([*argv, "--data-dir", str(tmp_path / "tfds")])
    cfg = json.loads((tmp_path / "config.json").read_text())["config"]
    assert cfg["dataset"] == "cifar10" and cfg["standardize"] == "channel"
    assert cfg["methods"] == ["sgd", "ssgd", "asgd", "dc-asgd-c", "dc-asgd-a"]
    assert "Test error % beside the paper's" in res["table"]
    assert "(paper 8.19)" in res["table"] and "(paper 8.65)" in res["table"]


def test_dc_asgd_lambda0_is_tuned_as_multiples_of_the_papers(tmp_path):
    """``--dc-lambda-scales``: each DC method's paper λ0 (0.04, 2) times the scales, a knob
    tuned with the rate; at scale 1 a cell is the fixed-λ0 method's cell bit for bit."""
    cfg = async_workers.Config(methods=("dc-asgd-c", "dc-asgd-a"), dc_lambda_scales=(0.1, 1))
    lams = {(c["method"], c["lam"]) for c in async_workers._cells(cfg.resolved())}
    assert lams == {("dc-asgd-c", 0.004), ("dc-asgd-c", 0.04), ("dc-asgd-a", 0.2),
                    ("dc-asgd-a", 2.0)}  # fmt: skip
    assert "dc_lambda_scales" not in async_workers.Config().resolved()  # run ids as before
    with pytest.raises(ConfigError, match="dc_lambda_scales: applies to dc-asgd-c / dc-asgd-a"):
        async_workers.Config(methods=("asgd",), dc_lambda_scales=(1.0,))


@pytest.mark.slow  # two sweeps (12 s); the builder's bit-for-bit test stays in make test
def test_dc_asgd_at_scale_one_is_the_fixed_lambda0_cell(tmp_path):
    argv = ["--steps", "20", "--seeds", "1", "--workers", "4", "--batch-size", "16"]
    argv += ["--lrs", "0.03", "--extend-edges", "0", "--methods", "dc-asgd-a"]
    tuned = async_workers.main([*argv, "--dc-lambda-scales", "1,10", "--out", str(tmp_path / "a")])
    plain = async_workers.main([*argv, "--out", str(tmp_path / "b")])
    at1 = [r for r in tuned["rows"] if r["lam"] == 2.0]
    drop = ("lam", *TIMING_FIELDS)
    assert [{k: v for k, v in r.items() if k not in drop} for r in at1] == [
        {k: v for k, v in r.items() if k not in drop} for r in plain["rows"]
    ]
    assert {r["lam"] for r in tuned["rows"]} == {2.0, 20.0}


@pytest.mark.slow  # 25 s of GPT compiles; `make test-slow`
def test_language_model_end_to_end(tmp_path):
    """A text: asynchronous workers train a GPT (the default on a text); rows, selection and
    tables in nats; a run whose loss stays at log V counts as diverged."""
    out = tmp_path / "lm"
    res = async_workers.main(
        ["--dataset", "shakespeare", "--quick", "--methods", "sgd,asgd", "--workers", "4",
         "--steps", "12", "--eval-every", "6", "--seeds", "1", "--lrs", "0.03,30",
         "--out", str(out)]
    )  # fmt: skip
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["model"] == "gpt-tiny" and cfg["updates"] == 12
    rows = {(r["method"], r["lr"]): r for r in res["rows"]}
    ok = rows[("asgd", 0.03)]
    assert not ok["diverged"] and 0 < ok["final_val_loss"] < 4.42 and ok["max_staleness"] >= 1
    assert rows[("asgd", 30.0)]["diverged"]  # NaN, or a loss not below log 83
    assert res["selected"][("asgd", 4, 0.9)] == (0.03, None)
    assert "**Test loss (nats/token) at each method's learning rate" in res["table"]
    assert "next character; validation split" in res["table"]
    assert "Updates until validation loss ≤ 2 at the selected rate" in res["table"]


def test_a_text_quick_run_defaults_to_a_gpt_and_three_methods():
    cfg = async_workers.Config(dataset="shakespeare", quick=True).resolved()
    assert (cfg["model"], cfg["methods"], cfg["updates"]) == (
        "gpt-tiny",
        ["sgd", "asgd", "dana"],
        100,
    )
    assert async_workers.Config(quick=True).resolved()["methods"] == list(
        async_workers.DEFAULT_METHODS
    )
