"""Synchronous trainer: determinism, loop/seed-mode parity, divergence, batch norm, extra args."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxstale
from jaxstale import data, models, train


@pytest.fixture(scope="module")
def digits():
    # The raw arrays these tests were calibrated on (e.g. the divergence step); the trainer does
    # not care whether the inputs are standardised.
    return data.load("digits", validation=0.0, standardize="none")


def _losses(results):
    return np.array([[c["train_loss"] for c in r["curve"]] for r in results])


def _fit(ds, **kw):
    args = dict(steps=12, batch_size=32, seeds=2, eval_every=4, loop="scan", seed_mode="vmap")
    args.update(kw)
    return train.fit("mlp", optax.sgd(0.05, momentum=0.9), ds, **args)


@pytest.fixture(scope="module")
def reference(digits):
    return _fit(digits)


def test_same_seed_identical_metrics(digits, reference):
    again = _fit(digits)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_s"} for r in rs]
    assert strip(again) == strip(reference)  # bitwise equal floats
    assert [c["step"] for c in reference[0]["curve"]] == [4, 8, 12]
    assert reference[0]["curve"] != reference[1]["curve"]  # seeds differ


def test_vmap_and_sequential_seeds_agree(digits, reference):
    seq = _fit(digits, seed_mode="sequential")
    np.testing.assert_allclose(_losses(seq), _losses(reference), rtol=1e-5, atol=1e-6)
    accs = lambda rs: [c["test_accuracy"] for r in rs for c in r["curve"]]
    np.testing.assert_allclose(accs(seq), accs(reference), atol=1 / 359 + 1e-9)
    assert [r["seed_mode"] for r in seq] == ["sequential"] * 2


@pytest.mark.parametrize(
    "kw", [{"loop": "host"}, {"loop": "unrolled", "unroll_chunk": 2}, {"max_chunk": 2}]
)
def test_host_unrolled_and_chunked_loops_match_scan(digits, reference, kw):
    other = _fit(digits, **kw)
    np.testing.assert_allclose(_losses(other), _losses(reference), rtol=1e-5, atol=1e-6)


def test_reduces_loss_on_digits(digits):
    (res,) = train.fit(
        "mlp", optax.sgd(0.1, momentum=0.9), digits, steps=80, batch_size=64, eval_every=20
    )
    losses = [c["train_loss"] for c in res["curve"]]
    assert losses[-1] < 0.5 * losses[0] and res["final_test_accuracy"] > 0.85
    assert res["final_train_loss"] == losses[-1] and not res["diverged"]


def _mlp_blowing_up_for_seed_1(seed):
    """An MLP whose seed-1 weights are so large that its very first loss is inf/NaN."""
    module = models.create("mlp", input_shape=(8, 8, 1), num_classes=10, seed=seed)
    if seed == 1:
        params = nnx.state(module, nnx.Param)
        nnx.update(module, jax.tree.map(lambda p: p * 1e25, params))
    return module


@pytest.mark.parametrize(
    "seed_mode", [pytest.param("vmap", marks=pytest.mark.slow), "sequential"]
)  # make test ≤ 8 min: one mode there
def test_divergence_is_recorded_and_other_seeds_carry_on(digits, seed_mode):
    kw = dict(steps=6, batch_size=32, eval_every=3, loop="scan", seed_mode=seed_mode)
    tx = optax.sgd(0.05)
    both = train.fit(_mlp_blowing_up_for_seed_1, tx, digits, seeds=[0, 1], **kw)
    alone = train.fit(_mlp_blowing_up_for_seed_1, tx, digits, seeds=[0], **kw)
    good, bad = both
    assert bad["diverged"] and bad["diverged_step"] == 1 and bad["final_test_accuracy"] is None
    # its records say so (jaxstale.loop): null accuracy from the diverging interval on; alone it
    # stops there, vmapped with a live seed it shares the clock until the end
    assert bad["curve"] and all(c["test_accuracy"] is None for c in bad["curve"])
    assert len(bad["curve"]) == (2 if seed_mode == "vmap" else 1)
    assert not good["diverged"] and good["diverged_step"] is None
    np.testing.assert_allclose(_losses([good]), _losses(alone), rtol=1e-6)
    assert good["final_test_accuracy"] == pytest.approx(alone[0]["final_test_accuracy"])


def test_divergence_step_is_the_same_in_every_loop(digits):
    kw = dict(steps=10, batch_size=32, seeds=1, eval_every=5, seed_mode="sequential")
    runs = {
        # lr = 100^count: the weights blow up geometrically, the loss turns inf/NaN mid-interval
        loop: train.fit("mlp", optax.sgd(lambda c: 10.0 ** (2 * c)), digits, loop=loop, **kw)[0]
        for loop in ("host", "scan")
    }
    step = runs["host"]["diverged_step"]
    assert runs["host"]["diverged"] and step == 6  # inside the second interval (steps 6-10)
    assert runs["scan"]["diverged_step"] == step
    curve = runs["host"]["curve"]  # a finite record, then the diverging interval's (null), stop
    assert [c["step"] for c in curve] == [5, 10] and curve[0]["test_accuracy"] is not None
    assert curve[1]["test_accuracy"] is None


@pytest.mark.slow  # long (5 s, a ResNet compile); models/test_functional checks BN updates fast
def test_batch_norm_state_is_carried(digits):
    kw = dict(width=4, blocks_per_stage=1)
    (res,) = train.fit(
        "resnet20",
        optax.sgd(0.05, momentum=0.9),
        digits,
        steps=3,
        batch_size=16,
        eval_every=3,
        seed_mode="sequential",
        loop="host",
        model_kwargs=kw,
        return_params=True,
    )
    init = models.functional(
        models.create("resnet20", input_shape=(8, 8, 1), num_classes=10, **kw)
    ).state
    assert jax.tree.leaves(init)  # the model has batch statistics
    changed = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(res["state"]), strict=True)
    ]
    assert all(changed)
    assert not res["diverged"] and 0.0 <= res["final_test_accuracy"] <= 1.0


def test_extra_args_transform_plugs_in(digits, reference):
    # DC-ASGD at zero staleness (stale_params = params) is plain SGD, bit for bit.
    tx = optax.chain(jaxstale.dc_asgd(), optax.sgd(0.05, momentum=0.9))
    res = train.fit(
        "mlp",
        tx,
        digits,
        steps=12,
        batch_size=32,
        seeds=2,
        eval_every=4,
        loop="scan",
        seed_mode="vmap",
        extra_args=lambda p: {"stale_params": p},
    )
    np.testing.assert_allclose(_losses(res), _losses(reference), rtol=1e-6)


def test_make_train_step_donates_and_learns():
    f = models.functional(models.create("mlp", input_shape=(2, 2, 1), num_classes=2))
    tx = optax.sgd(0.5)
    step = train.make_train_step(f.apply, tx)
    params, opt_state, state = jax.tree.map(jnp.copy, (f.params, tx.init(f.params), f.state))
    x, y = jnp.ones((4, 2, 2, 1)), jnp.zeros(4, jnp.int32)
    first = jax.tree.leaves(params)[0]
    params, opt_state, state, l0 = step(params, opt_state, state, x, y)
    assert first.is_deleted()  # donated
    for _ in range(3):
        params, opt_state, state, loss = step(params, opt_state, state, x, y)
    assert float(loss) < float(l0)


def test_evaluate_pads_last_batch(digits):
    f = models.functional(models.create("mlp", input_shape=(8, 8, 1), num_classes=10))
    x, y = digits.x_test[:37], digits.y_test[:37]
    full = train.evaluate(f.apply, f.params, f.state, x, y, batch_size=37)
    assert train.evaluate(f.apply, f.params, f.state, x, y, batch_size=8) == full
    logits, _ = f.apply(f.params, f.state, jnp.asarray(x), False)
    assert full == pytest.approx(float(np.mean(np.argmax(logits, -1) == y)))
    with pytest.raises(ValueError, match="examples"):
        train.evaluate(f.apply, f.params, f.state, x, y[:3])


def test_bad_arguments(digits):
    tx = optax.sgd(0.1)
    with pytest.raises(ValueError, match="loop"):
        train.fit("mlp", tx, digits, steps=2, batch_size=8, loop="python")
    with pytest.raises(ValueError, match="seed_mode"):
        train.fit("mlp", tx, digits, steps=2, batch_size=8, seed_mode="pmap")
    with pytest.raises(ValueError, match="steps"):
        train.fit("mlp", tx, digits, steps=0, batch_size=8)
    with pytest.raises(ValueError, match="seeds"):
        train.fit("mlp", tx, digits, steps=2, batch_size=8, seeds=[])
    with pytest.raises(TypeError, match="dataset"):
        train.fit("mlp", tx, object(), steps=2, batch_size=8)
    assert train.default_strategy("cnn", "cpu") == ("host", "sequential")
    assert train.default_strategy("anything", "gpu") == ("scan", "vmap")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d._replace(y_train=d.y_train + 10), "y_train must be in [0, 10)"),
        (
            lambda d: d._replace(x_test=np.where(d.x_test == d.x_test.max(), np.nan, d.x_test)),
            "x_test must hold finite numbers",
        ),
        (lambda d: d._replace(x_val=d.x_val[:, :4]), "x_val and x_train differ in shape"),
    ],
    ids=["labels beyond the classes", "NaN features", "split shapes"],
)
def test_fit_refuses_a_malformed_dataset_in_one_line(change, words):
    """Once these trained and showed up as 'diverged' runs (issue 21)."""
    ds = change(data.load("digits"))
    with pytest.raises(ValueError) as e:
        train.fit("mlp", optax.sgd(0.1), ds, steps=2, batch_size=8)
    assert str(e.value).startswith("fit: dataset 'digits':") and words in str(e.value)


def test_fit_refuses_a_model_with_the_wrong_number_of_logits():
    def wide(seed):
        return nnx.Sequential(
            lambda x: x.reshape(x.shape[0], -1), nnx.Linear(64, 11, rngs=nnx.Rngs(seed))
        )

    with pytest.raises(ValueError, match=r"fit: model\(seed\): .* logits of shape \(2, 11\)"):
        train.fit(wide, optax.sgd(0.1), "digits", steps=2, batch_size=8)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d._replace(x_train=d.x_train.astype(np.float32)), "token ids [N, T]"),
        (lambda d: d._replace(y_test=d.y_test[:, :8]), "token ids [N, T] of one shape"),
        (lambda d: d._replace(x_val=d.x_val + 83), "x_val must be in [0, 83)"),
    ],
    ids=["float inputs", "targets of another length", "ids beyond the vocabulary"],
)
def test_fit_refuses_a_malformed_text_dataset_in_one_line(change, words):
    """A language model's splits are token ids [N, T] for inputs and targets alike."""
    ds = change(data.load("shakespeare"))
    with pytest.raises(ValueError) as e:
        train.fit("gpt-tiny", optax.adam(1e-3), ds, steps=2, batch_size=8)
    assert str(e.value).startswith("fit: dataset 'shakespeare':") and words in str(e.value)
