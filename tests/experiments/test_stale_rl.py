"""experiments/stale_rl: the staleness schedules, the learner's lanes, a tiny grid end to end
(the supervised start cached and resumed), bad input as one line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import stale_rl
from experiments.stale_rl import learner, tables
from jaxstale import rl

TASK = rl.Reverse(length=4, symbols=5)


def test_schedules_by_hand():
    c = learner.schedule("constant", 2, 4, 3)
    assert c.tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2], [2, 2, 2]]  # warm-up: min(t, τ)
    f = learner.schedule("inflight", 4, 6, 5)
    assert f[-1].tolist() == [4, 3, 2, 1, 0] and f[1].tolist() == [1, 1, 1, 1, 0]
    g = learner.schedule("gamma", 3, 200, 2)
    assert g.shape == (200, 2) and (g[:, 0] == g[:, 1]).all() and 2 <= g[50:].mean() <= 4
    s = learner.schedule("stragglers", 3, 200, 2)
    assert s.max() > g.max()  # the slow samplers' rollouts arrive later
    with pytest.raises(ValueError, match="delay"):
        learner.schedule("random", 1, 2, 2)


def test_cells_run_tau_zero_once_for_the_reference():
    cfg = stale_rl.Config(arms=("is", "ppo-clip"), taus=(0, 2), lrs=(1e-3,), seeds=2).resolved()
    cells = stale_rl.cells(cfg)
    assert len(cells) == 2 + 2 * 2
    assert {c["arm"] for c in cells if c["tau"] == 0} == {"reinforce"}


@pytest.fixture(scope="module")
def lanes():
    apply, params = learner.policy("gpt-tiny", TASK)
    start = learner.supervised_start(apply, params, TASK, 5, 0)
    ev = (TASK.prompts(jax.random.key(1), 32), TASK.prompts(jax.random.key(2), 32))
    kw = dict(prompts=4, group=4, eval_every=3, eval_prompts=ev)

    def go(arm, tau, lrs, seeds, steps=6, mesh=None):
        taus = learner.schedule("constant", tau, steps, TASK.length)
        f = learner.make_train(apply, TASK, arm, taus=taus, mesh=mesh, **kw)
        return {k: np.asarray(v) for k, v in f(start, jnp.asarray(lrs), jnp.asarray(seeds)).items()}

    return go


def _same_on_policy(lanes, arms):
    ref = lanes("reinforce", 0, [2e-3], [0])
    for arm in arms:
        got = lanes(arm, 0, [2e-3], [0])
        # ratios are 1 up to the sampler's and the teacher-forced forward's rounding
        np.testing.assert_allclose(got["val"], ref["val"], atol=1e-6, err_msg=arm)
        np.testing.assert_allclose(got["ess"], 1.0, atol=1e-5)
        assert np.abs(got["kl"]).max() < 1e-5 and got["diverged"][0] == -1


@pytest.mark.slow  # 13 s: two programs (the losses' on-policy identity is fast in tests/rl)
def test_on_policy_a_step_rule_is_reinforce(lanes):
    _same_on_policy(lanes, ["vcpo"])  # ESS = 1: VCPO's step is Adam's


@pytest.mark.slow
def test_on_policy_every_arm_is_reinforce(lanes):
    _same_on_policy(lanes, [a for a in learner.ARMS if a not in ("reinforce", "vcpo")])


@pytest.mark.slow  # 14 s: two programs
def test_a_lane_is_the_same_alone_and_beside_others_and_a_nan_ends_it(lanes):
    both = lanes("ppo-clip", 2, [float("nan"), 2e-3, 4e-3], [0, 0, 1])
    alone = lanes("ppo-clip", 2, [4e-3], [1])
    for k in ("val", "train", "clipped"):
        np.testing.assert_array_equal(both[k][2], alone[k][0])
    assert both["val"].shape == (3, 3)  # update 0, 3, 6
    # NaN weights after update 0: update 1's loss is not finite
    assert both["diverged"].tolist() == [1, -1, -1]


TINY = ["--arms", "ppo-clip", "--taus", "0,2", "--lrs", "0.002", "--seeds", "2"]
TINY += ["--steps", "6", "--eval-every", "3", "--length", "4", "--symbols", "5", "--sup-steps", "5"]


def test_tiny_grid_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "rl"
    res = stale_rl.main([*TINY, "--out", str(out)])
    for name in ("summary.json", "table.md", "plot.png", "cliff.png", "inputs/start.npz"):
        assert (out / name).exists(), name
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert len(rows) == 2 + 2 and all(r["cpu_s"] > 0 for r in rows)
    assert len({r["start_digest"] for r in rows}) == 1
    assert all(0 <= r["mean_test_reward"] <= 1 for r in rows)  # the area under the test curve
    with np.load(out / "inputs" / "start.npz") as z:
        assert str(z["digest"]) == rows[0]["start_digest"]
    for section in (
        "Test reward at each arm's own rate",
        "Difference to on-policy",
        "Stability cliff",
        "What each correction did",
        "Validation grid",
    ):
        assert section in res["table"]
    assert "CPU-hours" not in res["table"]  # timing is printed, not tabled: resumes agree
    # a second run reuses every cell and the cached start: the same table
    again = stale_rl.main([*TINY, "--out", str(out)])
    assert again["table"] == res["table"]
    assert "4/4 cells already done" in capsys.readouterr().err


@pytest.mark.slow  # 10-35 s; make test keeps tests/study/test_claims_cells.py's inputs tests
def test_a_packed_sweep_resumes_from_its_own_start_not_this_machines(tmp_path, monkeypatch):
    # another machine's XLA:CPU trains a start that differs in its last bits: the cells must
    # resume from the start they were computed from, which travels in the archive
    from study import cells

    first = stale_rl.main([*TINY, "--out", str(tmp_path / "a" / "rl")])
    box = tmp_path / "cells"
    cells.pack(tmp_path / "a", box, ["rl"])
    cells.restore(box, tmp_path / "b", ["rl"])
    for p in sorted((tmp_path / "b" / "rl" / "cells").iterdir())[:1]:
        p.unlink()  # one group left to compute

    def retrain(*a, **k):
        raise AssertionError("the start was retrained instead of restored")

    monkeypatch.setattr(learner, "supervised_start", retrain)
    again = stale_rl.main([*TINY, "--out", str(tmp_path / "b" / "rl")])
    assert again["table"] == first["table"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--taus", "2,4"], "--taus"),
        (["--group", "1"], "--group"),
        (["--steps", "10", "--eval-every", "3"], "--eval-every"),
        (["--arms", "magic"], "--arms"),
        (["--model", "mlp"], "--model"),
        (["--model", "gpt-nope"], "--model"),  # was a traceback from the model zoo
        (["--tolerance", "2"], "--tolerance"),  # rewards lie in [0, 1]: every rate "stable"
        (["--delays", "later"], "--delays"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        stale_rl.main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert flag in err[-1] and "Traceback" not in "".join(err)
    assert not (tmp_path / "x").exists()


def test_a_collapse_counts_at_chance_in_the_differences():
    rows = [{"arm": "a", "seed": 0, "final_test_reward": None, "diverged": True}]
    assert tables.scored(rows, "final_test_reward", 0.1)[0]["final_test_reward"] == 0.1
    assert tables.chance({"symbols": 9}) == 0.1


@pytest.mark.slow
def test_samplers_on_a_mesh_draw_the_emulators_ids(lanes):
    """Four samplers on a 'data' axis, the learner replicated: the same responses, rewards and
    evaluations; the behaviour log-probabilities float32 rounding apart (a sampler's forward
    over its share of the batch rounds differently from the whole batch's)."""
    from jaxstale import mesh as jmesh

    one = lanes("ppo-clip", 2, [2e-3, 4e-3], [0, 1])
    four = lanes("ppo-clip", 2, [2e-3, 4e-3], [0, 1], mesh=jmesh.make_mesh(4, "data"))
    for k in ("train", "val", "test", "clipped", "kept", "diverged"):
        np.testing.assert_array_equal(four[k], one[k], err_msg=k)
    for k in ("ess", "kl", "weight"):
        np.testing.assert_allclose(four[k], one[k], atol=1e-5, err_msg=k)


def test_the_mesh_is_checked_before_anything_runs():
    with pytest.raises(stale_rl.ConfigError, match="do not split over 3"):
        stale_rl.Config(executor="mesh", samplers=3).resolved()
    with pytest.raises(stale_rl.ConfigError, match="only --executor mesh"):
        stale_rl.Config(samplers=2)
    emulated = stale_rl.Config().resolved()
    assert "executor" not in emulated  # an emulated run's folder is the one it always was
    assert stale_rl.Config(executor="mesh", samplers=4).resolved()["samplers"] == 4


def _hand_rows():
    """On-policy 0.9 on 3 seeds; an arm at τ = 2 with 0.8, 0.8 and a diverged seed."""
    rows = [{"arm": "reinforce", "delay": "constant", "tau": 0, "lr": 1e-3, "seed": s,
             "final_val_reward": 0.9, "final_test_reward": 0.9, "diverged": False,
             "start_val_reward": 0.4, "clipped": 0.0, "kept": 1.0, "ess": 1.0, "kl": 0.0}
            for s in range(3)]  # fmt: skip
    for s, v in enumerate((0.8, 0.8, None)):
        rows.append({**rows[0], "arm": "is", "tau": 2, "seed": s, "final_val_reward": v,
                     "final_test_reward": v, "diverged": v is None,
                     **({"clipped": None, "kept": None, "ess": None, "kl": None} if v is None
                        else {})})  # fmt: skip
    return rows


def test_a_diverged_seed_counts_at_chance_in_the_difference_and_the_figures_draw():
    cfg = stale_rl.Config(arms=("is",), taus=(0, 2), lrs=(1e-3,), seeds=3, symbols=9).resolved()
    table, selected, stable = tables.make_table(_hand_rows(), cfg)
    # (0.8 − 0.9, 0.8 − 0.9, 0.1 − 0.9) / 3 = −0.333: the diverged seed is in, at chance 0.1
    assert "| is | -33.3 ± " in table
    assert "| is | 56.7 ± 100.4 [1/3 div., at chance] @ 0.001 |" in table
    assert stable[(("is", "constant", 2), 1e-3)] is False
    curves = [{**r, "_metrics": [{"step": 0, "val_reward": 0.4}]} for r in _hand_rows()]
    figs = tables.make_figures(curves, cfg, selected, stable)
    assert set(figs) == {"plot", "cliff"}
