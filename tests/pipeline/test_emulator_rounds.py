"""Pipeline emulator: how a round runs — vmapped lanes (seeds, learning rates, per-stage
hyper-parameters) and a round looped over its repeating ticks (2BW) — against separate,
unrolled runs of the same program."""

import jax
import numpy as np
import optax
import pytest

from jaxstale import data, loop, models, optimizers, pipeline, schedules
from jaxstale.pipeline import emulator
from tests.pipeline import mlp_helpers

LR, MOM = mlp_helpers.LR, mlp_helpers.MOM
_TX = optax.sgd(LR, momentum=MOM)  # one optimizer object: runs of one structure share a round


_model, _data, _stages = mlp_helpers.model, mlp_helpers.data, mlp_helpers.stages


def _maxdiff(a, b):
    leaves = lambda trees: [np.asarray(x) for t in trees for x in jax.tree.leaves(t)]
    return max(float(np.max(np.abs(x - y))) for x, y in zip(leaves(a), leaves(b), strict=True))


def _run(stages, prog, xb, yb, **kw):
    ex = emulator.executor(stages, prog, _TX, xb, yb, momentum=MOM, **kw)
    (res,) = loop.run(ex, [st.params for st in stages], [st.state for st in stages])
    return res


def test_sub_period_of_the_rounds():
    """2BW's round (2N ticks, N micro-batches per stage) repeats a 2-tick pattern; 1F1B's round
    is that pattern; a flush round (GPipe, 2BW without its delay) repeats none."""
    sub = lambda s, pol: (
        pipeline.compile(s, pol).period,
        emulator._sub_period(pipeline.compile(s, pol)),
    )
    assert sub(schedules.one_f_one_b(4, 8), "2bw") == (8, 2)
    assert sub(schedules.pipedream_2bw(3, 5, 2), "2bw") == (4, 2)
    assert sub(schedules.one_f_one_b(4, 8), "vanilla") == (2, 2)
    assert sub(schedules.one_f_one_b(4, 8), "sync") == (8, 8)
    assert sub(schedules.pipedream_2bw(3, 4, 2, delay=0), "2bw") == (8, 8)


@pytest.mark.parametrize(
    "n, policy",  # N = 2 in make test; N = 4 and a prediction (~40 s each) in make test-slow
    [
        (2, "2bw"),
        pytest.param(4, "2bw", marks=pytest.mark.slow),
        pytest.param(4, "spectrain-v1", marks=pytest.mark.slow),
    ],
)
def test_looped_round_equals_unrolled_round(n, policy):
    """The looped 2BW round (the default) and the unrolled one (``loop_ticks=False``) compute
    the same run to float rounding — stash look-backs, micro-batch accumulation, an update in
    one chunk of N, a prediction on the stashed versions — alone and in vmapped lanes."""
    stages = _stages(n, n)
    prog = pipeline.compile(schedules.pipedream_2bw(n, 7, n), policy)
    xb, yb = _data(7, seed=4)
    looped, unrolled = (_run(stages, prog, xb, yb, loop_ticks=lt) for lt in (None, False))
    assert emulator.for_program(stages, prog, _TX, momentum=MOM).looped
    assert _maxdiff(looped.params, unrolled.params) <= 1e-6
    np.testing.assert_allclose(looped.losses, unrolled.losses, rtol=1e-6)
    x2, y2 = _data(7, seed=5)
    ex = emulator.executor(stages, prog, _TX, np.stack([x2, xb]), np.stack([y2, yb]),
                           momentum=MOM, lanes=2)  # fmt: skip
    stack = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    lanes = loop.run(ex, [stack(s.params) for s in stages], [stack(s.state) for s in stages])
    assert _maxdiff(lanes[1].params, looped.params) <= 1e-6
    assert _maxdiff(lanes[0].params, looped.params) > 1e-4  # the other lane's data


def test_loop_ticks_refused_where_no_pattern_repeats():
    prog = pipeline.compile(schedules.one_f_one_b(3, 5), "sync")
    with pytest.raises(ValueError, match="repeat no shorter pattern"):
        emulator.PipelineEmulator(_stages(3, 3), prog, _TX, loop_ticks=True)
    assert not emulator.PipelineEmulator(_stages(3, 3), prog, _TX).looped


@pytest.mark.parametrize(
    "policy",  # vanilla in make test; the other two (~7 s each) in make test-slow
    [
        "vanilla",
        pytest.param("stash", marks=pytest.mark.slow),
        pytest.param("nesterov", marks=pytest.mark.slow),
    ],
)
def test_lanes_equal_separate_runs_with_per_lane_learning_rates(policy):
    """lanes=L: L runs (seeds x learning rates) in one vmapped round equal L separate runs."""
    stages = _stages(3, 3)
    sched = schedules.one_f_one_b(3, 6)
    prog = pipeline.compile(sched, policy)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=LR, momentum=MOM)
    lrs, seeds = [0.05, 0.2, 0.2], [0, 0, 1]
    inits = [models.functional_stages(_model(seed=s, blocks=3), 3) for s in seeds]
    data = [_data(6, seed=s) for s in seeds]
    stack = lambda trees: jax.tree.map(lambda *a: np.stack(a), *trees)
    ex = pipeline.make(
        "emulate",
        stages,
        prog,
        None,
        tx,
        np.stack([d[0] for d in data]),
        np.stack([d[1] for d in data]),
        momentum=MOM,
        lanes=3,
        hyperparams={"learning_rate": lrs},
    )
    params = [stack([f[k].params for f in inits]) for k in range(3)]
    states = [stack([f[k].state for f in inits]) for k in range(3)]
    lanes = loop.run(ex, params, states)
    for j, (lr, f, (xb, yb)) in enumerate(zip(lrs, inits, data, strict=True)):
        one = emulator.executor(stages, prog, optax.sgd(lr, MOM), xb, yb, momentum=MOM)
        (ref,) = loop.run(one, [s.params for s in f], [s.state for s in f])
        assert _maxdiff(lanes[j].params, ref.params) <= 1e-6, (policy, j)
        np.testing.assert_allclose(lanes[j].losses, ref.losses, rtol=1e-5)
    assert _maxdiff(lanes[1].params, lanes[2].params) > 0  # the seeds differ
    assert _maxdiff(lanes[0].params, lanes[1].params) > 0  # the learning rates differ


def test_lanes_bad_input():
    stages = _stages(2, 2)
    prog = pipeline.compile(schedules.one_f_one_b(2, 4), "vanilla")
    xb, yb = _data(4)
    with pytest.raises(ValueError, match="leading lane axis"):
        emulator.executor(stages, prog, _TX, xb, yb, lanes=2)
    with pytest.raises(ValueError, match="pass lanes"):
        emulator.executor(stages, prog, _TX, xb, yb, hyperparams={"learning_rate": [0.1]})
    with pytest.raises(ValueError, match="2 values for 3 lanes"):
        emulator.executor(
            stages, prog, _TX, np.stack([xb] * 3), np.stack([yb] * 3), lanes=3,
            hyperparams={"learning_rate": [0.1, 0.2]},
        )  # fmt: skip
    ex = emulator.executor(
        stages, prog, _TX, np.stack([xb] * 2), np.stack([yb] * 2), lanes=2,
        hyperparams={"learning_rate": [0.1, 0.2]},
    )  # fmt: skip
    stack = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    with pytest.raises(ValueError, match="inject_hyperparams"):
        ex.init([stack(s.params) for s in stages], [stack(s.state) for s in stages])
    with pytest.raises(ValueError, match="emulator-only"):
        pipeline.make("mesh", stages, prog, None, _TX, xb, yb, lanes=2)


def test_a_lane_may_set_a_hyperparameter_per_stage():
    """hyperparams: a lane's value may be one per stage (AsyncPP's β1); each stage's optimizer
    state then holds its own, and a wrong count is one line."""
    stages = _stages(3, 3)
    prog = pipeline.compile(schedules.one_f_one_b(3, 4), "stash")
    tx = optax.inject_hyperparams(optax.nadam)(learning_rate=0.01, b1=0.9)
    xb, yb = _data(4)
    f = models.functional_stages(_model(blocks=3), 3)
    b1 = optimizers.asyncpp_b1(0.9, 3)
    hp = {"learning_rate": [0.01, 0.02], "b1": [b1, 0.95]}
    ex = pipeline.make("emulate", stages, prog, None, tx, np.stack([xb, xb]), np.stack([yb, yb]),
                       lanes=2, hyperparams=hp)  # fmt: skip
    stack = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    state = ex.init([stack(s.params) for s in f], [stack(s.state) for s in f])
    got = [np.asarray(o.hyperparams["b1"]) for o in state["opt"]]
    np.testing.assert_allclose(np.stack(got), np.array([b1, [0.95] * 3]).T, rtol=1e-7)
    assert [float(o.hyperparams["learning_rate"][1]) for o in state["opt"]] == [
        np.float32(0.02)
    ] * 3
    with pytest.raises(ValueError, match="per-stage values must be 3"):
        pipeline.make("emulate", stages, prog, None, tx, np.stack([xb, xb]), np.stack([yb, yb]),
                      lanes=2, hyperparams={"b1": [[0.9, 0.9], 0.9]})  # fmt: skip


@pytest.mark.parametrize(
    "policy",
    # one micro-batch per pass stays in make test through tests/benchmarks/test_pipeline_data.py
    [pytest.param("vanilla", marks=pytest.mark.slow), "2bw"],
)
def test_indexed_data_equals_pre_batched_copies(policy):
    """``data.Indexed`` (one copy of the examples, per-step indices gathered inside the round)
    gives the pre-batched copy's run bit for bit — alone, split into micro-batches (2BW) and in
    lanes whose indices differ while they share the examples."""
    stages = _stages(3, 3)
    prog = pipeline.compile(schedules.one_f_one_b(3, 6), policy)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(20, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 3, size=20).astype(np.int32)
    idx = [data.batch_indices(20, batch_size=6, num_steps=6, seed=s) for s in (0, 1)]
    ref = _run(stages, prog, x[idx[0]], y[idx[0]])
    got = _run(stages, prog, data.Indexed(x, idx[0]), data.Indexed(y, idx[0]))
    assert _maxdiff(got.params, ref.params) == 0
    np.testing.assert_array_equal(got.losses, ref.losses)
    stack = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    inits = ([stack(s.params) for s in stages], [stack(s.state) for s in stages])
    lanes = [
        loop.run(emulator.executor(stages, prog, _TX, xb, yb, momentum=MOM, lanes=2), *inits)
        for xb, yb in [
            (np.stack([x[i] for i in idx]), np.stack([y[i] for i in idx])),
            (data.Indexed(x, np.stack(idx)), data.Indexed(y, np.stack(idx))),
        ]
    ]
    for j in range(2):
        assert _maxdiff(lanes[1][j].params, lanes[0][j].params) == 0
    assert _maxdiff(lanes[1][0].params, ref.params) == 0
    assert _maxdiff(lanes[1][1].params, ref.params) > 0  # lane 1's indices differ


def test_indexed_data_bad_input():
    stages = _stages(2, 2)
    prog = pipeline.compile(schedules.one_f_one_b(2, 4), "vanilla")
    x, y = np.zeros((10, 4, 4, 1), np.float32), np.zeros(10, np.int32)
    idx = data.batch_indices(10, batch_size=2, num_steps=4, seed=0)
    with pytest.raises(ValueError, match="both be arrays or both be Indexed"):
        emulator.executor(stages, prog, _TX, data.Indexed(x, idx), y[idx])
    with pytest.raises(ValueError, match="integer indices"):
        emulator.executor(stages, prog, _TX, data.Indexed(x, idx * 1.0), data.Indexed(y, idx))
    with pytest.raises(ValueError, match=r"xb.idx must index its 10 rows: found 1..10"):
        emulator.executor(stages, prog, _TX, data.Indexed(x, idx + 1), data.Indexed(y, idx))
    with pytest.raises(ValueError, match="3 mini-batches, the schedule 4"):
        emulator.executor(stages, prog, _TX, data.Indexed(x, idx[:3]), data.Indexed(y, idx[:3]))
    with pytest.raises(ValueError, match="leading lane axis of 2"):
        emulator.executor(stages, prog, _TX, data.Indexed(x, idx), data.Indexed(y, idx), lanes=2)
