"""experiments/memory.py: a pipeline sweep's memory, from the emulator's carried state, checked
before anything is written."""

import jax
import jax.numpy as jnp
import pytest

from experiments import memory, pipeline_staleness
from experiments.config import ConfigError
from experiments.pipeline_staleness import schedule_factory
from jaxstale import data, models, optimizers, pipeline


def _cfg(**kw):
    base = {
        "models": ["gpt-tiny"], "stages": [2], "methods": ["vanilla", "stash", "2bw", "sync"],
        "lrs": [0.001, 0.003, 0.01], "seeds": 5, "steps": 40, "batch_size": 8,
        "optimizer": "adamw", "momentum": 0.9, "backward": "saved", "executor": "emulate",
    }  # fmt: skip
    return {**base, **kw}


@pytest.fixture(scope="module")
def text():
    return data.load("shakespeare")


def _create(ds):
    return lambda name: models.create(
        name, input_shape=ds.x_train.shape[1:], num_classes=ds.num_classes, seed=0, task=ds.task
    )


def test_group_lanes_is_the_largest_group_a_sweep_runs_at_once():
    assert memory.group_lanes(_cfg(), vmapped=False) == 1
    assert memory.group_lanes(_cfg(), vmapped=True) == 15  # 3 rates × 5 seeds
    assert memory.group_lanes(_cfg(tune_seeds=1), vmapped=True) == 4  # the other 4 seeds
    assert memory.group_lanes(_cfg(tune_seeds=3), vmapped=True) == 9  # 3 rates × 3 seeds


@pytest.mark.parametrize("method", ["vanilla", "stash", "2bw", "sync", "pipemare"])
def test_a_short_timeline_carries_what_the_full_run_carries(method, text):
    """The check compiles a few rounds of each schedule: its slots are the full run's."""
    stages = models.functional_stages(_create(text)("gpt-tiny"), 2)
    tx = optimizers.per_stage("adamw", 1e-3, 0.9, 200)
    x = jax.ShapeDtypeStruct((8, 64), jnp.uint8)
    got = [
        pipeline.carried_bytes(stages, schedule_factory(method)(2, n), method, tx, x)
        for n in (12, 200)
    ]
    assert got[0] == got[1] > 0


def test_the_carry_counts_the_in_flight_activations(text):
    """Residuals grow with the mini-batch; the weights do not."""
    stages = models.functional_stages(_create(text)("gpt-tiny"), 2)
    tx = optimizers.per_stage("adamw", 1e-3, 0.9, 40)
    sched = schedule_factory("vanilla")(2, 12)
    size = [
        pipeline.carried_bytes(stages, sched, "vanilla", tx, jax.ShapeDtypeStruct((b, 64), "uint8"))
        for b in (8, 16, 32)
    ]
    assert size[2] - size[1] == 2 * (size[1] - size[0]) > 0
    weights = sum(a.size * a.dtype.itemsize for s in stages for a in jax.tree.leaves(s.params))
    assert size[2] - size[1] > weights  # at batch 32 the activations outweigh the model


def test_a_sweep_that_cannot_fit_is_refused_naming_what_would_fix_it(text):
    cfg, create = _cfg(), _create(text)
    built = {"gpt-tiny": create("gpt-tiny")}
    one = pipeline.carried_bytes(
        models.functional_stages(create("gpt-tiny"), 2), schedule_factory("stash")(2, 12),
        "stash", optimizers.per_stage("adamw", 1e-3, 0.9, 40),
        jax.ShapeDtypeStruct((8, 64), "uint8"),
    )  # fmt: skip
    check = lambda limit, vmapped=True, **kw: memory.check_pipeline(
        {**cfg, **kw}, text, built, schedule_factory, lambda name: vmapped, limit=limit
    )
    check(10**12)  # fits
    split = text.x_train.nbytes + text.y_train.nbytes  # one copy, every lane's indices into it
    with pytest.raises(ConfigError) as e:  # 15 lanes do not fit, one does
        check(split + 3 * one)
    assert e.value.field == "seed_mode" and "15 runs at once" in e.value.reason
    assert "--seed-mode sequential runs one at a time" in e.value.reason
    assert "(gpt-tiny, N=2, stash:" in e.value.reason
    check(split + 3 * one, vmapped=False)  # one at a time fits
    with pytest.raises(ConfigError) as e:  # not even one run fits
        check(split + one // 2, vmapped=False)
    assert e.value.field == "batch_size" and "one run:" in e.value.reason
    with pytest.raises(ConfigError) as e:  # the mesh runs one run at a time: lanes do not count
        check(one // 2, executor="mesh")
    assert e.value.field == "batch_size"
    assert "activations) and its mini-batches;" in e.value.reason  # the mesh copies them
    with pytest.raises(ConfigError, match="and its mini-batches' indices;"):  # the emulator's
        check(split + one // 2, vmapped=False)


def test_the_experiment_refuses_before_writing_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory, "machine_memory", lambda: 50 * 2**20)
    out = tmp_path / "run"
    argv = ["--dataset", "shakespeare", "--model", "gpt-tiny", "--quick", "--batch-size", "256"]
    argv += ["--out", str(out)]
    with pytest.raises(SystemExit) as e:
        pipeline_staleness.main(argv)
    assert e.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --batch-size: " in err[0] and "of memory" in err[0], err
