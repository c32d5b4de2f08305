"""Policies are data: the table, validation, and a policy registered at run time running in
both pipeline executors and in experiments/pipeline_staleness.py without editing any file."""

import json

import numpy as np
import optax
import pytest

from experiments import pipeline_staleness
from jaxstale import loop, models, pipeline, schedules
from jaxstale.pipeline import POLICIES, Policy, register_policy


def test_the_table_defines_every_builtin_policy():
    assert set(POLICIES) >= {"sync", "vanilla", "stash", "spectrain-v1", "spectrain-v2", "nesterov"}
    assert set(POLICIES) >= {"2bw", "pipemare", "pipemare-lr", "asyncpp", "pipedream-lr"}
    assert POLICIES["sync"].flush and POLICIES["stash"].stash
    assert POLICIES["2bw"].schedule == "2bw" and POLICIES["asyncpp"].stash
    assert POLICIES["pipemare"].predict == "pipemare" and not POLICIES["pipemare"].stash
    assert POLICIES["pipemare-lr"].lr_anneal == POLICIES["pipedream-lr"].lr_anneal == 0.14
    assert POLICIES["spectrain-v1"].target == POLICIES["nesterov"].target == "roundtrip"
    assert not POLICIES["spectrain-v2"].predict_backward
    assert pipeline.get_policy("spectrain") is POLICIES["spectrain-v1"]  # alias


def test_registration_is_validated():
    with pytest.raises(ValueError, match="built in"):
        register_policy(Policy("stash"))
    with pytest.raises(ValueError, match="target"):
        register_policy(Policy("bad-target", target="future"))
    with pytest.raises(ValueError, match="predict"):
        register_policy(Policy("bad-rule", predict="adam"))
    with pytest.raises(ValueError, match="cannot be combined"):
        register_policy(Policy("both", stash=True, predict="spectrain"))
    with pytest.raises(ValueError, match="schedule"):
        register_policy(Policy("bad-schedule", schedule="zigzag"))
    with pytest.raises(ValueError, match="flush and schedule"):
        register_policy(Policy("both-schedules", flush=True, schedule="2bw"))
    with pytest.raises(ValueError, match="lr_anneal"):
        register_policy(Policy("bad-anneal", lr_anneal=0))
    with pytest.raises(ValueError, match="decay"):
        register_policy(Policy("bad-decay", predict="pipemare", decay=1.0))
    with pytest.raises(TypeError):
        register_policy({"name": "dict"})
    with pytest.raises(ValueError, match="unknown policy"):
        pipeline.get_policy("nope")
    register_policy(Policy("twice"), overwrite=True)
    with pytest.raises(ValueError, match="already registered"):
        register_policy(Policy("twice"))


@pytest.mark.slow  # long end to end; `make test-slow`
def test_a_registered_policy_runs_in_both_executors_and_the_experiment(tmp_path):
    # NAG prediction towards the sequential target: one row, no other file touched
    register_policy(Policy("nesterov-sequential", predict="nesterov"), overwrite=True)
    model = models.create("mlp", input_shape=(4, 4, 1), num_classes=3, hidden=(8, 8))
    stages = models.functional_stages(model, 3)
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(6, 4, 4, 4, 1)).astype(np.float32)
    yb = rng.integers(0, 3, (6, 4)).astype(np.int32)
    tx, init = optax.sgd(0.1, 0.9), ([s.params for s in stages], [s.state for s in stages])
    sched = schedules.one_f_one_b(3, 6)
    out = {}
    for executor in pipeline.EXECUTORS:
        ex = pipeline.make(executor, stages, sched, "nesterov-sequential", tx, xb, yb, momentum=0.9)
        (out[executor],) = loop.run(ex, *init)
    np.testing.assert_allclose(out["mesh"].losses, out["emulate"].losses, atol=1e-5)
    # it is its own policy: not vanilla, not the round-trip NAG
    for other in ("vanilla", "nesterov"):
        ex = pipeline.make("emulate", stages, sched, other, tx, xb, yb, momentum=0.9)
        (res,) = loop.run(ex, *init)
        assert np.abs(res.losses - out["emulate"].losses).max() > 1e-6, other
    # the experiment runs it by name and records what the policy is in its config
    argv = ["--model", "mlp", "--stages", "2", "--seeds", "1", "--steps", "12", "--lrs", "0.01"]
    argv += ["--methods", "nesterov-sequential", "--out", str(tmp_path / "run")]
    rows = pipeline_staleness.main(argv)["rows"]
    assert [r["method"] for r in rows] == ["nesterov-sequential"]
    assert rows[0]["target"] == "sequential" and not rows[0]["diverged"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["policies"]["nesterov-sequential"]["predict"] == "nesterov"
