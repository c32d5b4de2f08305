"""The mesh pipeline executor against the sequential model and the single-device emulator.

Same model, data, seed and program: the weights after K mini-batches must agree to 1e-5
(float32; on the MLP they agree bit for bit). The fast tests: SpecTrain with Adam at N = 2, the
devices' schedule, memory and errors; every other parity case and the full matrix (every
schedule and policy, both backward readings, 4 and 8 devices, MLP and CNN) are marked slow.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec

from jaxstale import data, loop, models, pipeline, schedules
from jaxstale.losses import cross_entropy
from jaxstale.mesh import make_mesh
from jaxstale.pipeline import POLICIES

LR, MU, K, B, MICRO = 0.1, 0.9, 4, 4, 2
TOL = 1e-5
# PipeMare's rescheduling annealed over the whole short run (the registered T rounds to 1 update)
PIPEMARE = POLICIES["pipemare"]._replace(lr_anneal=1.0)
PIPEMARE_LR = POLICIES["pipemare-lr"]._replace(lr_anneal=1.0)
PIPEDREAM_LR = POLICIES["pipedream-lr"]._replace(lr_anneal=1.0)
ADAM = optax.adam(0.01)  # one object: runs of one structure share a compiled round


def _model(name: str, n: int):
    if name == "mlp":  # every stage a different shape: input layer, body, loss head
        hidden = (12, 20, 8, 16, 10, 14, 6)[: n - 1]
        return models.create("mlp", input_shape=(4, 4, 1), num_classes=5, hidden=hidden)
    return models.create(
        "cnn", input_shape=(8, 8, 1), num_classes=5, channels=(2, 3), hidden=(8, 6)
    )


def _data(name: str, k: int = K):
    rng = np.random.default_rng(0)
    shape = (4, 4, 1) if name == "mlp" else (8, 8, 1)
    xb = rng.normal(size=(k, B, *shape)).astype(np.float32)
    yb = rng.integers(0, 5, (k, B)).astype(np.int32)
    return xb, yb


def _flat(params) -> jax.Array:
    return jnp.concatenate([ravel_pytree(p)[0] for p in params])


class _Setup:
    """One model split per (name, N); every schedule and policy runs on it."""

    def __init__(self, name: str, n: int):
        self.name, self.n = name, n
        self.model = _model(name, n)
        self.stages = models.functional_stages(self.model, n)
        self.xb, self.yb = _data(name)
        self.tx = optax.sgd(LR, momentum=MU)
        self.mesh = make_mesh(n, "stage")

    def data_for(self, sched_name: str):
        if sched_name == "1f1b":  # no micro-batches: the same stream as K·M mini-batches
            return (
                self.xb.reshape(K * MICRO, B // MICRO, *self.xb.shape[2:]),
                self.yb.reshape(K * MICRO, B // MICRO),
            )
        if sched_name == "2bw":  # M = N micro-batches of one sample: mini-batches of max(B, N)
            size = max(B, self.n)
            return (
                self.xb.reshape(K * B // size, size, *self.xb.shape[2:]),
                self.yb.reshape(K * B // size, size),
            )
        return self.xb, self.yb

    def schedule(self, sched_name: str):
        xb, _ = self.data_for(sched_name)
        kw = {} if sched_name == "1f1b" else {"num_micro": self.n if sched_name == "2bw" else MICRO}
        return schedules.get(sched_name, num_stages=self.n, num_batches=len(xb), **kw)

    def run(self, executor: str, sched_name: str, policy, tx=None, **kw):
        xb, yb = self.data_for(sched_name)
        ex = pipeline.make(
            executor, self.stages, self.schedule(sched_name), policy, tx or self.tx, xb, yb,
            momentum=MU, mesh=self.mesh if executor == "mesh" else None, **kw,
        )  # fmt: skip
        init = ([s.params for s in self.stages], [s.state for s in self.stages])
        (res,) = loop.run(ex, *init, eval_every=3)
        return res

    def parity(self, sched_name, policy, target=None, backward="saved", tx=None):
        kw = {"target": target, "backward": backward, "tx": tx}
        want = self.run("emulate", sched_name, policy, **kw)
        got = self.run("mesh", sched_name, policy, **kw)
        moved = float(jnp.max(jnp.abs(_flat(want.params) - _flat([s.params for s in self.stages]))))
        assert moved > 1e-2  # the run did something
        np.testing.assert_allclose(got.losses, want.losses, atol=1e-5)
        assert [c["step"] for c in got.curve] == [c["step"] for c in want.curve]
        return float(jnp.max(jnp.abs(_flat(want.params) - _flat(got.params))))


_SETUPS: dict = {}


def _setup(name: str, n: int) -> _Setup:
    if (name, n) not in _SETUPS:
        _SETUPS[(name, n)] = _Setup(name, n)
    return _SETUPS[(name, n)]


@pytest.mark.slow  # long: compiles many executables; `make test-slow`
def test_gpipe_equals_sequential_sgd_on_the_unsplit_model():
    """GPipe with M micro-batches == plain SGD with momentum on the whole model and batch."""
    s = _setup("mlp", 4)
    f = models.functional(s.model)
    tx = optax.sgd(LR, momentum=MU)
    p, st = f.params, tx.init(f.params)
    loss = lambda p, x, y: cross_entropy(f.apply(p, f.state, x, True)[0], y)
    losses = []
    for k in range(K):
        value, g = jax.value_and_grad(loss)(p, s.xb[k], s.yb[k])
        losses.append(float(value))
        u, st = tx.update(g, st, p)
        p = optax.apply_updates(p, u)
    res = s.run("mesh", "gpipe", "sync")
    assert float(jnp.max(jnp.abs(ravel_pytree(p)[0] - _flat(res.params)))) < TOL
    np.testing.assert_allclose(res.losses, losses, atol=1e-5)


@pytest.mark.slow  # 5 s; the mesh parity with Adam stays in make test
def test_weights_live_one_stage_per_device_and_the_devices_do_the_schedule():
    s = _setup("mlp", 4)
    prog = pipeline.compile(s.schedule("gpipe"), "sync")
    ex = pipeline.make("mesh", s.stages, prog, None, s.tx, s.xb, s.yb, mesh=s.mesh)
    state = ex.init([st.params for st in s.stages], [st.state for st in s.stages])
    for r in range(ex.num_rounds):
        state, _ = ex.step(state, r)
    assert state.params.sharding.spec == PartitionSpec("stage")
    assert len(state.params.sharding.device_set) == 4
    # GPipe, counted on the devices: every stage busy 2·K·M ticks, efficiency M / (M + N − 1)
    busy = np.asarray(state.busy)
    np.testing.assert_array_equal(busy, 2 * K * MICRO)
    assert busy.sum() / (4 * prog.schedule.num_ticks) == pytest.approx(MICRO / (MICRO + 4 - 1))


@pytest.mark.parametrize(
    "n, sched, policy, target, backward",
    [
        pytest.param(4, "1f1b-flush", "vanilla", None, "saved", marks=pytest.mark.slow),
        pytest.param(4, "1f1b", "stash", None, "saved", marks=pytest.mark.slow),  # 7.5 s
        pytest.param(4, "1f1b", "nesterov", "roundtrip", "recompute", marks=pytest.mark.slow),
        pytest.param(8, "1f1b", "spectrain-v1", "roundtrip", "saved", marks=pytest.mark.slow),
        pytest.param(4, "1f1b", PIPEMARE, None, "saved", marks=pytest.mark.slow),
    ],
    ids=lambda v: v.name if isinstance(v, pipeline.Policy) else None,
)
def test_parity_with_emulator(n, sched, policy, target, backward):
    assert _setup("mlp", n).parity(sched, policy, target, backward) < TOL


@pytest.mark.slow  # make test: under its 8-minute budget
def test_prediction_runs_with_adam_in_both_executors():
    """SpecTrain's rule on Adam's last update (PipeOptim's predictor): same weights on both."""
    s = _setup("mlp", 2)
    assert s.parity("1f1b", "spectrain-v1", tx=ADAM) < TOL
    moved = s.run("emulate", "1f1b", "spectrain-v1", tx=ADAM).params
    plain = s.run("emulate", "1f1b", "vanilla", tx=ADAM).params
    assert float(jnp.max(jnp.abs(_flat(moved) - _flat(plain)))) > 1e-5  # the prediction acted


def test_indexed_data_runs_on_the_mesh():
    """The mesh takes ``data.Indexed`` (materialised: one stage's device holds the run's
    mini-batches) and matches the emulator gathering the same indices inside its round."""
    s = _setup("mlp", 2)
    x, y = s.xb.reshape(K * B, *s.xb.shape[2:]), s.yb.reshape(K * B)
    idx = data.batch_indices(K * B, batch_size=B, num_steps=K, seed=5)
    xi, yi = data.Indexed(x, idx), data.Indexed(y, idx)
    init = ([st.params for st in s.stages], [st.state for st in s.stages])
    runs = {}
    for name, xb, yb in [("mesh", xi, yi), ("copy", x[idx], y[idx]), ("emulate", xi, yi)]:
        ex = pipeline.make("emulate" if name == "emulate" else "mesh", s.stages,
                           s.schedule("gpipe"), "sync", s.tx, xb, yb,
                           mesh=None if name == "emulate" else s.mesh)  # fmt: skip
        (runs[name],) = loop.run(ex, *init)
    np.testing.assert_array_equal(runs["mesh"].losses, runs["copy"].losses)
    assert float(jnp.max(jnp.abs(_flat(runs["mesh"].params) - _flat(runs["copy"].params)))) == 0
    np.testing.assert_allclose(runs["mesh"].losses, runs["emulate"].losses, atol=TOL)
    with pytest.raises(ValueError, match=r"xb.idx must index its 16 rows: found -1..14"):
        pipeline.make("mesh", s.stages, s.schedule("gpipe"), "sync", s.tx,
                      data.Indexed(x, idx - 1), yi, mesh=s.mesh)  # fmt: skip


def test_errors():
    s = _setup("mlp", 2)
    xb, yb = s.data_for("1f1b")
    sched = s.schedule("1f1b")
    with pytest.raises(ValueError, match="has 4 devices but 2 are needed"):
        pipeline.make("mesh", s.stages, sched, "vanilla", s.tx, xb, yb, mesh=make_mesh(4))
    with pytest.raises(ValueError, match="axis named 'stage'"):
        pipeline.make("mesh", s.stages, sched, "vanilla", s.tx, xb, yb, mesh=make_mesh(2, "data"))
    with pytest.raises(TypeError, match="Functional"):
        pipeline.make("mesh", [object(), object()], sched, "vanilla", s.tx, xb, yb)
    bn = models.functional_stages(
        models.create("resnet20", input_shape=(8, 8, 1), num_classes=3, width=4), 2
    )
    with pytest.raises(ValueError, match="batch-norm"):
        pipeline.make("mesh", bn, schedules.one_f_one_b(2, 2), "vanilla", s.tx, *_data("cnn", 2))


_FLUSH = [
    (sched, p, None)
    for sched in ("gpipe", "1f1b-flush")
    for p in ("sync", "vanilla", "stash", "spectrain-v1", "spectrain-v2", "nesterov")
]  # no staleness: every policy is synchronous SGD on these schedules


def _registered_cases() -> list:
    """Every registered policy on the schedule it runs (its own, e.g. 2BW's, else async 1F1B),
    at both prediction targets where it predicts towards the round trip; PipeMare-style
    rescheduling over the first update (``lr_anneal=1.0``) so that the short runs exercise it.
    Built from the registry: a policy added with ``register_policy`` is parity-tested too."""
    cases = []
    for name, pol in POLICIES.items():
        sched = pol.schedule or "1f1b"
        run = pol._replace(lr_anneal=1.0) if pol.lr_anneal else name
        both = pol.predict in ("spectrain", "nesterov") and pol.target == "roundtrip"
        cases += [(sched, run, t) for t in (("sequential", "roundtrip") if both else (None,))]
    return cases


_ALL = _FLUSH + _registered_cases()
# and two crossings: a prediction on 2BW's stashed versions, PipeMare under a flush
_ALL += [("2bw", "spectrain-v1", None), ("1f1b-flush", PIPEMARE, None)]


def _id(v):
    return v.name if isinstance(v, pipeline.Policy) else None


@pytest.mark.slow
@pytest.mark.parametrize("backward", ["saved", "recompute"])
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("sched, policy, target", _ALL, ids=_id)
def test_parity_with_emulator_all(n, sched, policy, target, backward):
    schedule = pipeline.get_policy(policy).schedule or sched
    if backward == "recompute" and schedule == "2bw":  # refused (tests/pipeline/test_recompute.py)
        with pytest.raises(ValueError, match="not available"):
            _setup("mlp", n).parity(sched, policy, target, backward)
        return
    diff = _setup("mlp", n).parity(sched, policy, target, backward)
    name = policy.name if isinstance(policy, pipeline.Policy) else policy
    print(f"mlp N={n} {sched} {name} {target} {backward}: max|diff| = {diff:.3g}")
    assert diff < TOL


@pytest.mark.slow
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize(
    "policy, target",
    [("spectrain-v1", "roundtrip"), ("spectrain-v2", None), ("nesterov", "roundtrip")],
)
def test_parity_with_emulator_adam(n, policy, target):
    """The prediction policies with optax.adam as the stage optimizer (PipeOptim's predictor)."""
    diff = _setup("mlp", n).parity("1f1b", policy, target, tx=ADAM)
    print(f"mlp N={n} 1f1b {policy} {target} adam: max|diff| = {diff:.3g}")
    assert diff < TOL


@pytest.mark.slow
@pytest.mark.parametrize("backward", ["saved", "recompute"])
@pytest.mark.parametrize(
    "sched, policy", [("gpipe", "sync"), ("1f1b", "stash"), ("1f1b", "nesterov")]
)
def test_parity_with_emulator_cnn(sched, policy, backward):
    """Convolutional first stages, dense later ones: heterogeneous stages on 4 devices."""
    diff = _setup("cnn", 4).parity(sched, policy, backward=backward)
    print(f"cnn N=4 {sched} {policy} {backward}: max|diff| = {diff:.3g}")
    assert diff < TOL
