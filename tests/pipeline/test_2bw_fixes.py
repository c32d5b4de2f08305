"""The two 2BW rows of issue 52 against the one-step-delayed recursion they must be, on the
unsplit model: ``2bw-spectrain`` (SpecTrain from the version read, along that version's own
last update) and ``2bw-ef`` (error feedback around the optimizer), on both executors."""

import jax
import numpy as np
import optax
import pytest

from jaxstale import loop, models, pipeline, schedules
from jaxstale.losses import cross_entropy
from tests.pipeline import mlp_helpers

LR, MOM = mlp_helpers.LR, mlp_helpers.MOM


def _pipeline(policy, executor="emulate", nb=6):
    xb, yb = mlp_helpers.data(nb, seed=3)
    stages = mlp_helpers.stages(3, 3)
    sched = schedules.pipedream_2bw(3, nb, 2)
    ex = pipeline.make(executor, stages, sched, policy, optax.sgd(LR, momentum=MOM), xb, yb)
    (res,) = loop.run(ex, [st.params for st in stages], [st.state for st in stages])
    return res, xb, yb


def _recursion(xb, yb, point, correct):
    """W(t+1) = W(t) + step_t with the gradient at ``point(W, t)`` and ``correct(u, t, us)``
    turning SGD-momentum's update u_t into the step, on the unsplit model."""
    f = models.functional(mlp_helpers.model(blocks=3))
    tx = optax.sgd(LR, momentum=MOM)
    grad = jax.jit(jax.grad(lambda p, x, y: cross_entropy(f.apply(p, f.state, x, True)[0], y)))
    w, o, us = [f.params], tx.init(f.params), []
    for t in range(len(xb)):
        u, o = tx.update(grad(point(w, t), xb[t], yb[t]), o, w[t])
        us.append(u)
        w.append(optax.apply_updates(w[t], correct(u, t, us)))
    return w[-1]


def _close(a, b, tol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def _full(params_per_stage):
    """The unsplit model's params from the stages' (the MLP's blocks in order)."""
    f = models.functional(mlp_helpers.model(blocks=3))
    flat = [x for p in params_per_stage for x in jax.tree.leaves(p)]
    return jax.tree.unflatten(jax.tree.structure(f.params), flat)


def _sub(a, b):
    return jax.tree.map(lambda x, y: x - y, a, b)


def _add(a, b, c=1.0):
    return jax.tree.map(lambda x, y: x + c * y, a, b)


@pytest.mark.parametrize("executor", ["emulate", "mesh"])
def test_2bw_spectrain_predicts_from_the_version_it_reads(executor):
    """Mini-batch t reads version v = max(t − 1, 0) and predicts one update ahead along
    v's own last update: P_t = W_v + (W_v − W_{v−1}) (W_{−1} = W_0; no prediction at t = 0)."""
    res, xb, yb = _pipeline("2bw-spectrain", executor)

    def point(w, t):
        v = max(t - 1, 0)
        return w[v] if t == 0 else _add(w[v], _sub(w[v], w[max(v - 1, 0)]))

    want = _recursion(xb, yb, point, lambda u, t, us: u)
    _close(_full(res.params), want)
    # and it is neither 2BW nor synchronous SGD
    plain = _recursion(xb, yb, lambda w, t: w[max(t - 1, 0)], lambda u, t, us: u)
    diff = max(float(abs(a - b).max()) for a, b in zip(jax.tree.leaves(plain),
               jax.tree.leaves(want), strict=True))  # fmt: skip
    assert diff > 1e-4


@pytest.mark.parametrize("executor", ["emulate", "mesh"])
def test_2bw_ef_is_error_feedback_on_the_one_step_delay(executor):
    """W(t+1) = W(t) + u_t + (u_t − u_{t−1}) from the second update, u_t SGD-momentum's update
    from ∇f(W(t − 1))."""
    res, xb, yb = _pipeline("2bw-ef", executor)
    correct = lambda u, t, us: u if t == 0 else _add(u, _sub(u, us[t - 1]))
    want = _recursion(xb, yb, lambda w, t: w[max(t - 1, 0)], correct)
    _close(_full(res.params), want)


def test_the_rows_and_their_memory():
    pol = pipeline.POLICIES
    assert pol["2bw-ef"].feedback == 1.0 and pol["2bw-ef"].stash
    assert pol["2bw-spectrain"].predict == "spectrain" and not pol["2bw-spectrain"].stash
    prog = pipeline.compile(schedules.one_f_one_b(4, 8), "2bw-spectrain")
    assert prog.stash_capacity == (3, 3, 3, 3) and prog.predicts_back  # W_v, W_{v−1} and new
    assert pipeline.compile(schedules.one_f_one_b(4, 8), "2bw").stash_capacity == (2, 2, 2, 2)
    assert not pipeline.compile(schedules.one_f_one_b(4, 8), "nesterov").predicts_back
    with pytest.raises(ValueError, match="pipemare predictor"):
        pipeline.register_policy(pipeline.Policy("x", predict="pipemare", schedule="2bw"))
    with pytest.raises(ValueError, match="feedback"):
        pipeline.register_policy(pipeline.Policy("y", feedback=-1.0))
