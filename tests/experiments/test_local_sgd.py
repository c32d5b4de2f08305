"""local_sgd: data parallelism and the DiLoCo family at equal tokens, outer rates selected on
validation, paired against synchronous DiLoCo; bad input refused in one line."""

import json

import numpy as np
import pytest

from experiments import local_sgd as exp
from jaxstale import data, tasks

TINY = ["--dataset", "digits", "--model", "mlp", "--steps", "8", "--inner-steps", "4"]
TINY += ["--workers", "2", "--seeds", "2", "--extend-edges", "0", "--batch-size", "16"]


@pytest.mark.slow  # 19 s, four compiled programs; the tables' logic is tested on rows below
def test_equal_tokens_fewer_exchanges_end_to_end(tmp_path):
    out = tmp_path / "run"
    argv = [*TINY, "--lrs", "0.7", "--methods", "dp", "diloco", "diloco-eager", "streaming"]
    argv += ["async-delayed"]
    argv += ["async-cgad", "--adam-lrs", "0.003", "--dp-scales", "2"]
    res = exp.main([*argv, "--overlaps", "1", "--out", str(out)])
    rows = json.loads((out / "summary.json").read_text())["rows"]
    by = {r["method"]: r for r in rows if r["seed"] == 0}
    assert set(by) == {
        "dp",
        "diloco",
        "diloco-eager",
        "streaming τ=1",
        "async-delayed",
        "async-cgad",
    }
    assert by["dp"]["lr"] == 2.0 and by["diloco"]["lr"] == 0.7  # dp: the inner rate × 2
    assert by["async-cgad"]["lr"] == 0.003  # outer Adam's own grid
    assert by["dp"]["tokens"] == by["diloco"]["tokens"] == 2 * 8 * 16  # M × steps × B
    assert by["dp"]["models_sent"] == 8 and by["diloco"]["models_sent"] == 2  # H-fold fewer
    assert by["streaming τ=1"]["updates"] == 4 and by["streaming τ=1"]["models_sent"] == 2
    assert by["async-delayed"]["updates"] == 4 and by["async-delayed"]["models_sent"] == 2
    eager = by["diloco-eager"]  # a round per H steps; the other worker's half arrives late
    assert eager["models_sent"] == 2 and eager["mean_staleness"] == 0.5
    assert all(r["final_val_accuracy"] is not None for r in rows) and len(rows) == 12
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 for r in rows)  # the group's share each
    table = res["table"]
    assert "| mlp | dp − diloco |" in table and "models sent" in table
    assert (out / "plot.png").exists()


def test_dps_rate_multiplies_the_inner_rate():
    """One worker's one-step Δ under outer SGD at rate s is the inner AdamW at s × its rate
    (its warm-up, cosine and decoupled decay included): dp's grid tunes its own rate."""
    import optax

    from jaxstale import localsgd, optimizers
    from tests.localsgd.helpers import flat, run, setup

    sched = localsgd.synchronous(1, 12, 1)
    f, xb, yb = setup(sched.num_batches)
    adamw = lambda lr: optimizers.per_stage("adamw", lr, 0.9, 12)
    scaled = run(f, adamw(0.003), optax.sgd(2.5), sched, xb, yb)
    direct = run(f, adamw(0.0075), optax.sgd(1.0), sched, xb, yb)
    np.testing.assert_allclose(flat(scaled.params), flat(direct.params), atol=2e-6)
    assert np.max(np.abs(flat(scaled.params) - flat(f.params))) > 1e-2  # it trained


def _row(method, lr, seed, test, h=10):
    val = test + (0.0 if lr in (0.7, 1.0) else -0.2)  # validation prefers 0.7 (and dp's 1)
    return {"model": "mlp", "method": method, "workers": 4, "inner_steps": h, "lr": lr,
            "seed": seed, "final_val_accuracy": val, "final_test_accuracy": test,
            "diverged": False, "updates_to_target": None, "wall_time": 100.0 + seed,
            "models_sent": 5, "mean_staleness": 0.0}  # fmt: skip


def test_tables_select_on_validation_and_pair_every_method_with_diloco():
    rows = [_row("dp", 1.0, s, 0.80 + s / 100, h=10) for s in range(3)]
    rows += [_row("diloco", lr, s, 0.78 + s / 100 + h / 1000, h=h)
             for lr in (0.3, 0.7) for s in range(3) for h in (10, 50)]  # fmt: skip
    cfg = {"dataset": "mnist1d", "optimizer": "adamw", "inner_lr": 0.003, "steps": 100,
           "batch_size": 32, "seeds": 3, "inner_steps": [10, 50], "lrs": [0.3, 0.7],
           "dp_scales": [1.0],
           "extend_edges": 0}  # fmt: skip
    task = tasks.classification(10)
    table, selected, picked = exp.make_table(rows, cfg, 0.1, task)
    assert selected[("mlp", "diloco", "M=4, H=10")] == 0.7
    assert selected[("mlp", "dp", "M=4, H=50")] == 1.0  # dp stands in every H's column
    assert (
        "| mlp | dp − diloco | **+1.0 ± 0.0** beyond noise | **-3.0 ± 0.0** beyond noise |" in table
    )
    assert len(picked) == 3 * 2 + 3 * 2


def test_each_method_gets_its_own_outer_rate_grid():
    grid = exp.grid_of(exp.Config(methods=("dp", "diloco", "async-cgad")).resolved())
    assert grid(("mlp", "dp")) == list(exp.DP_SCALES)
    assert grid(("mlp", "diloco")) == list(exp.OUTER_LRS)
    assert grid(("mlp", "async-cgad")) == list(exp.ADAM_LRS)
    assert "adam_lrs" not in exp.Config(methods=("diloco",)).resolved()  # run ids as before


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "10"], "10 is not a multiple of H = 4"),
        (["--fragments", "3"], "H = 4 is not a multiple of 3"),
        (["--overlaps", "2"], "τ must be below H/P = 2 (H = 4)"),
        (["--model", "resnet20"], "'resnet20' has batch norm"),
        (["--methods", "dp", "dp"], "'dp' is given twice"),
        (["--alpha", "1.5"], "alpha"),
        (["--methods", "diloco", "--overlaps", "1"], "--overlaps is Streaming DiLoCo's"),
        (["--methods", "diloco", "--adam-lrs", "0.01"], "--adam-lrs is async-cgad's"),
        (["--methods", "diloco", "--dp-scales", "2"], "--dp-scales is dp's"),
        (["--methods", "async-cgad", "--adam-lrs", "0"], "adam-lrs"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        exp.main([*TINY, *argv, "--out", str(out)])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow  # eight compiled programs
def test_the_mesh_executor_gives_the_emulators_rows(tmp_path):
    argv = [*TINY, "--lrs", "0.7", "--methods", "dp", "diloco", "async-delayed", "streaming"]
    argv += ["--overlaps", "1", "--dp-scales", "1"]
    em = exp.main([*argv, "--out", str(tmp_path / "em")])["rows"]
    me = exp.main([*argv, "--executor", "mesh", "--out", str(tmp_path / "me")])["rows"]
    key = lambda r: (r["method"], r["seed"])
    assert sorted(map(key, em)) == sorted(map(key, me))
    by = {key(r): r for r in em}
    for r in me:
        want = by[key(r)]
        for field in ("final_val_accuracy", "final_test_accuracy", "final_train_loss"):
            assert r[field] == pytest.approx(want[field], abs=1e-5), (key(r), field)
        assert (r["tokens"], r["models_sent"]) == (want["tokens"], want["models_sent"])
    assert {r["method"] for r in me} == {"dp", "diloco", "async-delayed", "streaming τ=1"}


@pytest.mark.slow  # ~20 s: two GPT programs
def test_the_language_model_runs_from_its_names_and_reads_loss(tmp_path):
    """Issue 24's workload by name: the embedded Shakespeare with gpt-tiny, momentum look-ahead
    beside DiLoCo, tables in nats per token (lower is better)."""
    out = tmp_path / "run"
    argv = ["--dataset", "shakespeare", "--model", "gpt-tiny", "--steps", "8", "--inner-steps"]
    argv += ["4", "--workers", "2", "--seeds", "1", "--extend-edges", "0", "--lrs", "0.7"]
    exp.main([*argv, "--methods", "diloco", "async-lookahead", "--out", str(out)])
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"diloco", "async-lookahead"}
    assert all(np.isfinite(r["final_test_loss"]) and r["final_test_loss"] > 0 for r in rows)
    assert "Test loss (nats/token)" in (out / "table.md").read_text()
    # a GPT's throughput in every row (issue 54): its tokens over its share of the group's time
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] * 64 / r["wall_s"], rel=0.01)
        assert r["flops_per_token"] > 6 * 27_000 and r["mfu"] is None  # a CPU: no peak known


def test_the_memory_check_counts_the_largest_group_not_every_seed_and_rate():
    """A two-stage sweep's largest group is the rate grid on its tuning seeds (issue: the
    DiLoCo family at 6,750 inner steps was refused for 40 lanes it never holds at once)."""
    cfg = {"lrs": [0.3, 0.5, 0.7, 1.0], "adam_lrs": [0.001, 0.003, 0.01], "dp_scales": None,
           "seeds": 10, "tune_seeds": 3, "executor": "emulate"}  # fmt: skip
    assert exp.group_lanes(cfg) == 12  # 4 rates × 3 tuning seeds
    assert exp.group_lanes({**cfg, "tune_seeds": None}) == 40
    assert exp.group_lanes({**cfg, "executor": "mesh"}) == 1
    ds = data.load("digits")
    run = {"workers": [4, 16], "steps": 100, "batch_size": 32}
    # vmapped lanes: int32 indices (host and device) per lane, one copy of the split
    split = ds.x_train.nbytes + ds.y_train.nbytes
    assert exp.stream_bytes({**cfg, **run}, ds) == 2 * 4 * 16 * 100 * 32 * 12 + split
    # the mesh: one run's stream, materialised
    per = ds.x_train[:1].nbytes + ds.y_train[:1].nbytes
    assert exp.stream_bytes({**cfg, **run, "executor": "mesh"}, ds) == 2 * 16 * 100 * 32 * per


def test_the_memory_check_counts_each_workers_state():
    """Per run: the weights and the outer state, and per worker its inner state, dispatch point
    and end weights (a sweep whose states cannot fit: ``tests/experiments/test_common.py``)."""
    params = {"w": np.zeros((100, 10), np.float32), "b": np.zeros(10, np.float32)}
    p = 1010 * 4
    cfg = {"workers": [2, 8], "optimizer": "adam", "momentum": 0.9, "steps": 10,
           "methods": ["diloco", "dp"]}  # fmt: skip
    got = exp.state_bytes(cfg, params)
    small = got - (p + p + 8 * (2 * p + 2 * p))  # Nesterov's trace, Adam's two moments
    assert 0 <= small < 400  # injected hyper-parameters and counters: scalars
    sgd = exp.state_bytes({**cfg, "optimizer": "sgd"}, params)  # one momentum trace
    assert abs(sgd - (got - 8 * p)) < 400


def test_a_gpt_smoke_run_is_a_few_runs():
    """The image smoke run's 12 methods x 4 outer rates on a GPT took 29 minutes (118 runs,
    issue 51); a text --quick runs dp, DiLoCo and naive asynchronous Nesterov at two rates (12
    runs, 37 s on 2 cores)."""
    from experiments import local_sgd

    cfg = local_sgd.Config(quick=True, dataset="shakespeare", model=("gpt-tiny",)).resolved()
    assert cfg["methods"] == ["dp", "diloco", "async-nesterov"]
    assert cfg["lrs"] == [0.5, 0.7] and cfg["dp_scales"] == [1.0, 2.0] and cfg["seeds"] == 2
    assert len(local_sgd.Config(quick=True).resolved()["methods"]) > 10  # images: every method


def test_one_diloco_cell_end_to_end(tmp_path):
    """The fast suite's one local_sgd cell (the full matrix is slow): the runner builds its
    model, trains and writes its row (a slip in the runner's model keywords once raised on
    every run while every fast test passed)."""
    argv = [*TINY, "--seeds", "1", "--lrs", "0.7", "--methods", "diloco"]
    res = exp.main([*argv, "--out", str(tmp_path / "run")])
    (row,) = res["rows"]
    assert row["method"] == "diloco" and row["final_val_accuracy"] is not None
