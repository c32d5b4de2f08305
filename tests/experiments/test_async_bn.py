"""experiments/async_bn: the statistics bank against the registered methods, selection on
validation, the tables, bad input, resume, divergence, the metrics' records (tiny configs)."""

import json

import jax
import numpy as np
import pytest

from experiments import async_bn
from experiments.common import SMOKE, lanes_for, make_delay
from jaxstale import asyncdp, data, loop
from jaxstale.asyncdp.methods import build_lc_asgd_async_bn

TINY = ["--quick", "--steps", "12", "--eval-every", "6", "--workers", "1,4", "--batch-size", "16"]
TINY += ["--width", "4", "--lrs", "0.03,0.1"]


def _cfg(argv):
    from experiments.config import from_argv

    return from_argv(async_bn.Config, argv)[0].resolved()


@pytest.mark.slow  # long end to end; `make test-slow`
def test_end_to_end_rows_shared_weights_files_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    argv = [*TINY, "--out", str(out)]
    res = async_bn.main(argv)
    for name in ["summary.json", "table.md", "plot.png", "curves.png", "metrics.jsonl"]:
        assert (out / name).exists(), name
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {(r["workers"], r["lr"], r["seed"]) for r in rows} == {
        (m, lr, s) for m in (1, 4) for lr in (0.03, 0.1) for s in (0, 1)
    }
    for r in rows:
        got = {(q["policy"], q["decay"]) for q in r["policies"]}
        assert got == {("ordinary", 0.1), ("async-bn", 0.1), ("recomputed", None)}
        assert r["params_checksum"] is not None and not r["diverged"]
        assert r["cpu_s"] > 0 and r["wall_s"] > 0  # the group's share
        assert r["updates"] == 12 and (r["max_staleness"] == 0) == (r["workers"] == 1)
        by = {q["policy"]: q for q in r["policies"]}
        if r["workers"] == 1:  # one worker: the pulled copy is the server's, the policies agree
            assert by["ordinary"]["final_test_accuracy"] == by["async-bn"]["final_test_accuracy"]
    curve = res["rows"][0]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    mine = [m for m in metrics if all(m[k] == curve[k] for k in async_bn.KEY)]
    assert [m["step"] for m in mine] == [6, 12]
    assert "val_accuracy/ordinary d=0.1" in mine[0] and "val_accuracy/async-bn d=0.1" in mine[0]
    table = res["table"]
    assert table.startswith(SMOKE)  # --quick is a smoke run
    for text in async_bn.ROW_NAMES.values():
        assert text in table
    assert "Paired by seed" in table and "every learning rate of the grid" in table
    assert "Learning-rate selection" in table and "Rate selection" in table
    # the rate per M maximises the mean validation accuracy with recomputed statistics
    prow = async_bn.policy_rows(rows)
    for m in (1, 4):
        score = {
            lr: np.mean(
                [
                    r["final_val_accuracy"]
                    for r in prow
                    if r["policy"] == "recomputed" and r["workers"] == m and r["lr"] == lr
                ]
            )
            for lr in (0.03, 0.1)
        }
        assert score[res["selected"]["lr"][m]] == max(score.values())
    monkeypatch.setattr(async_bn, "_run_group", lambda *a: pytest.fail("recomputed a done cell"))
    again = async_bn.main(argv)
    assert again["table"] == table


@pytest.mark.slow  # long end to end; `make test-slow`
def test_bank_reproduces_the_registered_methods_and_their_shared_weights():
    """One run with a bank = the lc-asgd run (ordinary BN, m = 0.9) and the lc-asgd-async-bn
    run (here d = 0.3): the same weights bit for bit, the statistics to float rounding."""
    cfg = {**_cfg(["--workers", "4", "--decays", "0.3"]), "model_kw": {"width": 4}}
    cfg["model_kw"]["blocks_per_stage"] = 1  # ResNet-8: a quicker compile, the same layers
    ds = data.load("digits")
    sched = make_delay("gamma", 4, 16, batch_size=16, seed=3)
    apply, ps, ss, xs, ys = lanes_for(ds, "resnet20", cfg["model_kw"], 16, [(3, sched)])
    ex = async_bn.bank_executor(
        async_bn.bank_emulator(apply, cfg, False), [sched], xs, ys, learning_rate=[0.1]
    )
    (mine,) = loop.run(ex, ps[0], async_bn.init_bank(ss[0], len(cfg["decays"])))
    assert cfg["decays"] == [0.1, 0.3]
    common = dict(learning_rate=0.1, vmap=False)
    lc = asyncdp.run(apply, "lc-asgd", ps[0], ss[0], sched, xs[0], ys[0], **common)
    abn = asyncdp.run(
        apply,
        lambda hp: build_lc_asgd_async_bn(hp, lam=cfg["lam"], decay=0.3),
        ps[0],
        ss[0],
        sched,
        xs[0],
        ys[0],
        **common,
    )
    for ref in (lc, abn):  # training never reads the running statistics
        for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(ref.params), strict=True):
            np.testing.assert_array_equal(a, b)
    leaves = lambda t: [np.asarray(v) for v in jax.tree.leaves(t)]
    bank = mine.model_state
    close = lambda a, b: [
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
        for x, y in zip(leaves(a), leaves(b), strict=True)
    ]
    close(bank["ordinary"][0], lc.model_state)  # d = 1 − m: the model's own ordinary BN
    close(bank["model"], lc.model_state)
    close(bank["async-bn"][1], abn.model_state)  # d = 0.3
    # with 4 workers the policies differ (the stale chain vs the server's EMA)
    diff = max(
        float(np.max(np.abs(x - y)))
        for x, y in zip(leaves(bank["ordinary"][0]), leaves(bank["async-bn"][0]), strict=True)
    )
    assert diff > 1e-3


def test_curves_keep_every_policy_until_the_loss_diverges():
    """The metrics of loop.run's records: every policy's validation accuracy while a lane's loss
    is finite, train_loss None after; the interval where the last lane diverged (where the
    loop stopped) is not recorded."""
    from experiments.async_bn.train import _curves

    labels = ["ordinary d=0.1", "ordinary d=0.3", "async-bn d=0.1", "async-bn d=0.3"]

    def result(losses):  # loop.run's Result of one lane, intervals of 2 updates
        curve = [
            {"step": s, "batches": s, "train_loss": float(s),
             **{f"{lab}_accuracy": s / 10 + k / 100 for k, lab in enumerate(labels)}}
            for s in (2, 4, 6)
        ]  # fmt: skip
        losses = np.asarray(losses, np.float32)
        return loop.Result(None, None, losses, curve, False, None, None)

    nan = float("nan")
    a, b = result([1, 1, 1, nan, nan, nan]), result([1, 1, 1, 1, 1, np.inf])
    ca, cb = _curves([a, b], {"decays": [0.1, 0.3]}, spe=4)
    accs = {f"val_accuracy/{lab}": 0.2 + k / 100 for k, lab in enumerate(labels)}
    assert ca[0] == {"step": 2, "epoch": 0.5, "train_loss": 2.0, **accs}
    assert ca[1] == {"step": 4, "epoch": 1.0, "train_loss": None}  # diverged at update 4
    assert len(ca) == len(cb) == 2 and cb[1]["train_loss"] == 4.0  # step 6: both diverged
    ca, cc = _curves([a, result([1] * 6)], {"decays": [0.1, 0.3]}, spe=4)
    assert [c["train_loss"] for c in ca] == [2.0, None, None] and cc[-1]["train_loss"] == 6.0


def _prow(policy, decay, m, lr, seed, val, test, diverged=False):
    return {"policy": policy, "decay": decay, "workers": m, "lr": lr, "seed": seed,
            "diverged": diverged, "final_val_accuracy": None if diverged else val,
            "final_test_accuracy": None if diverged else test,
            "final_test_error": None if diverged else 1 - test,
            "updates_to_target": None}  # fmt: skip


def test_selection_uses_validation_never_test():
    """The rate per M by the recomputed statistics' validation accuracy (diverged at chance),
    then each policy's decay at that rate by its own validation accuracy; test data would
    choose otherwise every time."""
    rows = []
    for s in range(3):
        # lr 0.1: better on validation, worse on test; lr 0.3: one seed diverged
        rows += [
            _prow("recomputed", None, 4, 0.1, s, 0.9, 0.5),
            _prow("recomputed", None, 4, 0.03, s, 0.8, 0.99),
            _prow("recomputed", None, 4, 0.3, s, 0.95, 0.99, diverged=s == 0),
        ]
        for q in ("ordinary", "async-bn"):
            rows += [
                _prow(q, 0.1, 4, 0.1, s, 0.7, 0.99),
                _prow(q, 0.3, 4, 0.1, s, 0.8, 0.4),
                _prow(q, 0.1, 4, 0.03, s, 0.1, 0.1),
                _prow(q, 0.3, 4, 0.03, s, 0.99, 0.99),
            ]
    sel = async_bn.select(rows, chance_acc=0.1)
    assert sel["lr"] == {4: 0.1}  # 0.3 scores (0.1 + 2·0.95)/3 < 0.9 with its diverged seed
    assert sel["decay"] == {("ordinary", 4): 0.3, ("async-bn", 4): 0.3}


def test_paired_cells_say_when_a_difference_is_beyond_noise():
    a = [_prow("ordinary", 0.1, 8, 0.1, s, 0.5, t) for s, t in enumerate([0.80, 0.82, 0.81])]
    b = [_prow("async-bn", 0.1, 8, 0.1, s, 0.5, t) for s, t in enumerate([0.90, 0.91, 0.90])]
    c = [_prow("async-bn", 0.1, 8, 0.1, s, 0.5, t) for s, t in enumerate([0.70, 0.95, 0.81])]
    assert async_bn._paired(a, b).endswith("**beyond noise**")  # ordinary's error is higher
    assert async_bn._paired(a, b).startswith("+9.33 ±")
    assert "beyond noise" not in async_bn._paired(a, c)
    div = [_prow("ordinary", 0.1, 8, 0.1, s, 0.5, 0.8, diverged=True) for s in range(3)]
    assert async_bn._paired(div, b) == "no pairs" and async_bn._paired([], b) == "–"


def test_config_defaults_and_quick():
    d = _cfg([])
    assert d["workers"] == [1, 4, 8, 16] and d["lrs"] == [0.03, 0.1] and d["seeds"] == 5
    assert d["decays"] == [0.1, 0.02, 0.3] and d["updates"] == 600 and d["quick"] is False
    assert d["model"] == "resnet20" and d["model_kw"] == {"width": 8}
    q = _cfg(["--quick"])
    assert q["decays"] == [0.1] and q["seeds"] == 2 and q["updates"] == 80 and q["quick"]
    assert _cfg(["--decays", "0.5,0.1"])["decays"] == [0.1, 0.5]  # the default first, no repeats


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--decays", "1.5"], "argument --decays: expected a float in (0, 1]"),
        (["--workers", "0,4"], "argument --workers: expected an int in [1, inf)"),
        (["--lrs", "-0.1"], "argument --lrs: expected a float in (0, inf)"),
        (["--seeds", "0"], "argument --seeds"),
        (["--model", "mlp"], "argument --model: 'mlp' has no batch-norm statistics to compare"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--model", "mlp", "--width", "4"], "argument --width: applies to resnet20 only"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
    ],
)
def test_bad_input_is_a_one_line_usage_error_before_anything_is_written(
    tmp_path, capsys, flags, message
):
    out = tmp_path / "never"
    argv = [a for a in TINY if a not in ("--width", "4")] + flags + ["--out", str(out)]
    with pytest.raises(SystemExit) as e:
        async_bn.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.slow  # make test ≤ 8 min: CI runs it in make test-slow
def test_divergence_is_a_row_not_a_crash(tmp_path):
    argv = [*TINY, "--workers", "4", "--seeds", "1", "--lrs", "1e30", "--out", str(tmp_path)]
    res = async_bn.main(argv)
    (row,) = res["rows"]
    assert row["diverged"] and row["params_checksum"] is None
    assert all(q["final_test_accuracy"] is None for q in row["policies"])
    assert "diverged [1/1]" in res["table"]
