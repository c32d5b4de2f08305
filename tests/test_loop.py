"""The one driver loop (jaxstale.loop): rounds, evaluation cadence, divergence, records."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxstale import loop, train
from jaxstale.loop import Executor, Stats


def _toy(losses, counts=None, *, lanes=1, vmapped=False, params=None, batches=None):
    """An executor replaying given per-round losses ``[lanes, rounds]`` (params: a counter)."""
    losses = np.asarray(losses, np.float32).reshape(lanes, -1)
    counts = np.ones_like(losses, np.int32) if counts is None else np.asarray(counts)
    counts = counts.reshape(lanes, -1)
    calls = []

    def step(state, r):
        calls.append(r)
        return state + 1, Stats(losses[:, r : r + 1], counts[:, r : r + 1])

    final = jnp.zeros((lanes, 2)) if vmapped else jnp.zeros(2)
    return (
        Executor(
            init=lambda p, s: 0,
            step=step,
            params=lambda state: (final if params is None else params, {}),
            apply=lambda p, s, x, train: (x @ p, s),
            num_rounds=losses.shape[1],
            num_updates=int(counts.sum(axis=1).max()),
            lanes=lanes,
            vmapped=vmapped,
            batches_per_update=batches,
        ),
        calls,
    )


def test_records_at_the_end_of_each_interval_with_interval_means():
    ex, calls = _toy([1.0, 3.0, 2.0, 4.0, 6.0])
    (res,) = loop.run(ex, None, None, eval_every=2)
    assert calls == [0, 1, 2, 3, 4]
    assert [c["step"] for c in res.curve] == [2, 4, 5]
    assert [c["train_loss"] for c in res.curve] == [2.0, 3.0, 6.0]
    assert all(c["test_accuracy"] is None for c in res.curve)  # no eval data
    np.testing.assert_array_equal(res.losses, [1, 3, 2, 4, 6])
    assert not res.diverged and res.final_test_accuracy is None


def test_rounds_without_updates_are_skipped_and_counts_divide_sums():
    # a pipeline-like executor: warm-up rounds complete nothing, a round may complete two
    ex, _ = _toy([0.0, 0.0, 2.0, 6.0], counts=[0, 0, 1, 2], batches=3)
    (res,) = loop.run(ex, None, None, eval_every=1)
    assert [c["step"] for c in res.curve] == [1, 3]  # updates done, not rounds
    assert [c["batches"] for c in res.curve] == [3, 9]
    np.testing.assert_array_equal(res.losses, [2.0, 3.0, 3.0])


def test_divergence_is_per_lane_and_records_continue_while_others_run():
    ex, calls = _toy([[1.0, np.nan, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], lanes=2, vmapped=True)
    x, y = np.eye(2, dtype=np.float32), np.array([0, 1])
    res = loop.run(ex, None, None, eval_every=2, eval_data=(x, y))
    assert [r.diverged for r in res] == [True, False]
    assert res[0].diverged_step == 2 and res[1].diverged_step is None
    assert res[0].final_test_accuracy is None and res[1].final_test_accuracy == 0.5
    assert [c["test_accuracy"] for c in res[0].curve] == [None, None]
    assert np.isnan(res[0].curve[0]["train_loss"])
    assert len(calls) == 4  # the live lane ran to the end


def test_stops_once_every_lane_diverged():
    ex, calls = _toy([1.0, np.inf, 1.0, 1.0, 1.0, 1.0])
    (res,) = loop.run(ex, None, None, eval_every=2)
    assert calls == [0, 1] and res.diverged and res.diverged_step == 2
    assert len(res.curve) == 1 and np.isnan(res.losses[2:]).all()


def test_non_finite_final_weights_count_as_divergence():
    ex, _ = _toy([1.0, 1.0], params=jnp.array([[jnp.nan, 0.0], [0.0, 0.0]]))
    (res,) = loop.run(ex, None, None)
    assert res.diverged and res.diverged_step == 2


def test_accuracy_is_an_exact_count_whatever_the_batching():
    apply = lambda p, s, x, train: (x @ p, s)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 3)).astype(np.float32)
    y = rng.integers(0, 2, 37)
    w = jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)
    want = float(np.mean(np.argmax(x @ np.asarray(w), -1) == y))
    for bs in (1, 5, 37, 512):
        assert loop.accuracy(apply, w, {}, x, y, batch_size=bs).tolist() == [want]
    two = loop.accuracy(apply, jnp.stack([w, -w]), {}, x, y, vmap=True)
    assert two.shape == (2,) and two[0] == want
    hits = np.argmax(x @ np.asarray(w), -1) == y
    for bs in (5, 512):  # per example: the same examples, whose mean is the accuracy exactly
        each = loop.accuracy(apply, jnp.stack([w, -w]), {}, x, y, vmap=True, batch_size=bs,
                             per_example=True)  # fmt: skip
        assert each.shape == (2, 37) and (each[0] == hits).all()
        assert each.mean(axis=1).tolist() == two.tolist()
        assert (loop.decode_correct(loop.encode_correct(each[1])) == each[1]).all()
    with pytest.raises(ValueError, match="not an encoded vector"):
        loop.decode_correct("9:oA==")
    with pytest.raises(ValueError, match="empty"):
        loop.accuracy(apply, w, {}, x[:0], y[:0])


def test_bad_eval_every():
    ex, _ = _toy([1.0])
    with pytest.raises(ValueError, match="eval_every"):
        loop.run(ex, None, None, eval_every=0)


def test_named_eval_splits_are_recorded_and_final_per_split():
    w = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    ex, _ = _toy([[1.0, 1.0], [1.0, np.nan]], lanes=2, vmapped=True, params=jnp.stack([w, w]))
    x = np.eye(2, dtype=np.float32)
    splits = {"val": (x, np.array([0, 1])), "test": (x, np.array([1, 1]))}
    res = loop.run(ex, None, None, eval_every=1, eval_data=splits)
    assert res[0].curve[-1] == {"step": 2, "train_loss": 1.0, "val_accuracy": 1.0,
                                "test_accuracy": 0.5, "test_correct": "2:QA=="}  # fmt: skip
    # the final weights' test predictions: example 0 wrong, 1 right; none on earlier records
    assert loop.decode_correct(res[0].curve[-1]["test_correct"]).tolist() == [False, True]
    assert "test_correct" not in res[0].curve[0] and "test_correct" not in res[1].curve[-1]
    assert res[0].final_accuracy == {"val": 1.0, "test": 0.5}
    assert res[0].final_test_accuracy == 0.5
    assert res[1].final_accuracy == {"val": None, "test": None} and res[1].diverged
    with pytest.raises(ValueError, match="pair"):
        loop.run(ex, None, None, eval_data={"val": x})


def test_evaluation_hook_is_recorded_like_a_split_and_sees_the_stacked_weights():
    """evaluate(params, model_state) -> {name: [lanes]}: recorded as <name>_accuracy after the
    splits, None for a diverged lane, last value in final_accuracy; not called once every
    lane diverged; with no eval_data nothing else is recorded."""
    w = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    losses = [[1.0, 1.0, 1.0], [1.0, np.nan, 1.0]]
    ex, _ = _toy(losses, lanes=2, vmapped=True, params=jnp.stack([w, 2 * w]))
    seen = []

    def evaluate(params, model_state):
        seen.append(np.asarray(params).shape)
        return {"scale": np.asarray(params)[:, 0, 0] / 4, "test": 0.25}  # a scalar: every lane

    x = np.eye(2, dtype=np.float32)
    res = loop.run(ex, None, None, eval_every=1, eval_data={"val": (x, np.array([0, 1]))},
                   evaluate=evaluate)  # fmt: skip
    assert seen == [(2, 2, 2)] * 3  # once per interval, all lanes stacked
    assert res[0].curve[0] == {"step": 1, "train_loss": 1.0, "val_accuracy": 1.0,
                               "scale_accuracy": 0.25, "test_accuracy": 0.25}  # fmt: skip
    assert res[1].curve[0]["scale_accuracy"] == 0.5
    assert [c["scale_accuracy"] for c in res[1].curve] == [0.5, None, None]  # diverged at 2
    assert res[0].final_accuracy == {"val": 1.0, "scale": 0.25, "test": 0.25}
    assert res[0].final_test_accuracy == 0.25
    assert res[1].final_accuracy == {"val": None, "scale": None, "test": None}

    only, _ = _toy([1.0, np.nan, 1.0])
    calls = []
    (res,) = loop.run(only, None, None, eval_every=1, evaluate=lambda p, s: calls.append(1) or {})
    assert calls == [1] and res.curve[0] == {"step": 1, "train_loss": 1.0}  # no test_accuracy
    assert len(res.curve) == 2 and res.final_accuracy == {}


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        ({"val": 1.0}, ValueError, "also a split"),
        ({"": 1.0}, ValueError, "non-empty"),
        ({"a": [1.0, 2.0, 3.0]}, ValueError, "broadcast"),
        ([1.0], TypeError, "mapping"),
    ],
)
def test_evaluation_hook_answers_are_checked(answer, error, match):
    ex, _ = _toy([[1.0], [1.0]], lanes=2, vmapped=True)
    val = (np.eye(2, dtype=np.float32), np.array([0, 1]))
    with pytest.raises(error, match=match):
        loop.run(ex, None, None, eval_data={"val": val}, evaluate=lambda p, s: answer)


def test_jit_lanes_are_the_runs_alone_bit_for_bit():
    """loop.jit: a vmapped lane is the run alone, bit for bit (XLA:CPU), for the gradient and
    the loss of an MLP step; plain jax.jit rounds a bias gradient by the lane count there."""
    import jax

    from jaxstale import losses, models

    f = models.functional(models.create("mlp", input_shape=(8, 8, 1), num_classes=10))
    rng = np.random.default_rng(0)
    lanes = 16
    x = rng.normal(size=(lanes, 32, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, (lanes, 32)).astype(np.int32)
    params = jax.tree.map(lambda a: np.stack([np.asarray(a)] * lanes), f.params)

    def step(p, xx, yy):
        return jax.value_and_grad(lambda q: losses.cross_entropy(f.apply(q, {}, xx, True)[0], yy))(
            p
        )

    alone = [loop.jit(step)(f.params, x[i], y[i]) for i in range(lanes)]
    many = loop.jit(jax.vmap(step))(params, x, y)
    for i, (loss, grad) in enumerate(alone):
        assert np.asarray(loss) == np.asarray(many[0])[i]
        for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(many[1]), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[i])
    if jax.default_backend() == "cpu":
        assert loop.compiler_options() is not None  # this jaxlib knows the option


def test_a_loss_metric_records_the_mean_cross_entropy_of_every_target():
    """metric="loss": "<split>_loss" records (the evaluation's mean next-token loss, the same
    as optax's mean over every target), final_loss, no test_correct; lanes = runs alone."""
    import optax

    from jaxstale import evaluation

    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, (24, 6)).astype(np.int32)
    y = np.roll(x, -1, axis=1)
    apply = lambda p, s, xb, train: (p[xb], s)  # a bigram table [5, 5] of logits
    idx = np.arange(24).reshape(6, 4)
    p0 = jnp.zeros((5, 5))
    ex = train.executor(apply, optax.sgd(0.5), x, y, idx)
    (res,) = loop.run(ex, p0, {}, eval_every=3, eval_data={"val": (x, y)}, metric="loss")
    assert [set(c) for c in res.curve] == [{"step", "train_loss", "val_loss"}] * 2
    want = optax.softmax_cross_entropy_with_integer_labels(res.params[x], y).mean()
    assert res.final_loss["val"] == pytest.approx(float(want), rel=1e-6)
    assert res.metric == "loss" and res.final_accuracy == {} and res.final_test_accuracy is None
    assert res.curve[0]["val_loss"] < np.log(5)  # it learned from the uniform start
    # the batching does not change the mean beyond float32 rounding; lanes are runs alone
    one = evaluation.mean_loss(apply, res.params, {}, x, y, batch_size=5)
    lanes = evaluation.mean_loss(apply, jnp.stack([res.params, p0]), {}, x, y, vmap=True)
    assert one[0] == pytest.approx(res.final_loss["val"], rel=1e-6)
    assert lanes[0] == evaluation.mean_loss(apply, res.params, {}, x, y)[0]
    assert lanes[1] == pytest.approx(np.log(5))
    with pytest.raises(ValueError, match="metric"):
        loop.run(ex, p0, {}, metric="perplexity")


def test_a_loss_run_records_each_test_windows_loss_at_the_end():
    """The final record of a loss run carries ``test_losses``: each test window's mean loss,
    hand-checked against optax per window, whose mean is the record's test_loss; earlier
    records and the validation split carry none; batching and lanes do not change them."""
    import optax

    from jaxstale import evaluation

    rng = np.random.default_rng(1)
    x = rng.integers(0, 5, (10, 6)).astype(np.int32)
    y = np.roll(x, -1, axis=1)
    apply = lambda p, s, xb, train: (p[xb], s)
    ex = train.executor(apply, optax.sgd(0.5), x, y, np.arange(8).reshape(4, 2) % 10)
    data = {"val": (x[:4], y[:4]), "test": (x, y)}
    (res,) = loop.run(ex, jnp.zeros((5, 5)), {}, eval_every=2, eval_data=data, metric="loss")
    assert "test_losses" not in res.curve[0]
    got = evaluation.decode_losses(res.curve[-1]["test_losses"])
    want = optax.softmax_cross_entropy_with_integer_labels(res.params[x], y).mean(axis=1)
    np.testing.assert_allclose(got, want, atol=2e-3)  # float16 in the record
    assert res.final_loss["test"] == pytest.approx(float(want.mean()), rel=1e-6)
    exact = evaluation.mean_loss(apply, res.params, {}, x, y, per_example=True, batch_size=3)
    np.testing.assert_allclose(exact[0], want, rtol=1e-6)
    lanes = evaluation.mean_loss(
        apply, jnp.stack([res.params, res.params]), {}, x, y, vmap=True, per_example=True
    )
    assert (lanes[0] == lanes[1]).all() and lanes.shape == (2, 10)


def test_encoded_losses_round_trip_and_refuse_bad_text():
    from jaxstale import evaluation

    v = np.array([0.0, 1.25, 3.5, 1024.0])  # exact in float16
    assert (evaluation.decode_losses(evaluation.encode_losses(v)) == v).all()
    # a window scored not finite, or beyond float16, is recorded as such (never a crash)
    got = evaluation.decode_losses(evaluation.encode_losses([np.nan, 1e6, 2.0]))
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 2.0
    with pytest.raises(ValueError, match="not encoded"):
        evaluation.decode_losses("3:AD4=")
