"""The GPT (``jaxstale.models.gpt``): shapes, parameter count, causality, stages of whole
blocks (embedding first, head last) that compose to the model bit for bit, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstale import models
from jaxstale.models.gpt import gpt, gpt_param_count

KW = {"layers": 4, "width": 32, "heads": 4}
SMALL = {"layers": 2, "width": 16, "heads": 2}  # eager NNX calls: fewer ops, faster tests


def test_logits_shape_and_parameter_count():
    call = nnx.jit(lambda m, x: m(x))  # one compile per shape, not one per eager op
    model = gpt(16, 40, **SMALL)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 40, (3, 16)), jnp.int32)
    out = call(model, x)
    assert out.shape == (3, 16, 40) and call(model, x[:, :5]).shape == (3, 5, 40)
    assert models.param_count(model) == gpt_param_count(16, 40, layers=2, width=16)
    again = gpt(16, 40, **SMALL)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(call(again, x)))  # seeded


def test_a_position_sees_only_the_past():
    model = gpt(12, 20, **SMALL)
    x = np.random.default_rng(1).integers(0, 20, (2, 12))
    y = x.copy()
    y[:, 7] = (y[:, 7] + 1) % 20  # change token 7
    call = nnx.jit(lambda m, x: m(x))
    a, b = (np.asarray(call(model, jnp.asarray(v, jnp.int32))) for v in (x, y))
    np.testing.assert_array_equal(a[:, :7], b[:, :7])
    assert not np.allclose(a[:, 7:], b[:, 7:])


def test_stages_are_whole_blocks_embedding_first_head_last_and_compose_exactly():
    model = gpt(8, 30, **{**SMALL, "layers": 3})
    x = jnp.asarray(np.random.default_rng(2).integers(0, 30, (2, 8)), jnp.int32)
    for n in (1, 2, 3):
        stages = models.split(model, n)
        assert stages[0].blocks[0].embed and stages[-1].blocks[-1].head
        out = x
        for s in stages:
            out = s(out)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(model(x)))
    with pytest.raises(ValueError, match="multiple of heads"):
        gpt(8, 30, layers=1, width=30, heads=4)


@pytest.mark.slow  # 5 s of compile; the stage and causality tests above stay in make test
def test_gradients_flow_to_every_parameter_under_jit():
    f = models.functional(gpt(8, 30, **KW))
    x = jnp.asarray(np.random.default_rng(3).integers(0, 30, (2, 8)), jnp.int32)

    def loss(p):
        logits, _ = f.apply(p, f.state, x, True)
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    grads = jax.jit(jax.grad(loss))(f.params)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_presets_are_zoo_models_sized_by_the_data():
    """gpt-<preset> takes its context from the data's windows and its vocabulary from the
    classes; a shape it cannot take, and logits of the wrong shape, are one line each."""
    from jaxstale.models.gpt import PRESETS, preset_name

    assert {preset_name(k) for k in PRESETS} <= set(models.model_names())
    assert preset_name("cpu") == "gpt-cpu" and preset_name("gpt2-small") == "gpt2-small"
    model = models.create("gpt-tiny", input_shape=(16,), num_classes=40)
    assert len(model.blocks) == 2 and models.param_count(model) == gpt_param_count(
        16, 40, layers=2, width=32
    )
    models.check_logits(model, (16,), 40, task="language_model")
    with pytest.raises(ValueError, match=r"\(2, 16, 41\) needed"):
        models.check_logits(model, (16,), 41, task="language_model")
    with pytest.raises(ValueError, match="takes \\[B, T\\] token ids"):
        models.create("gpt-cpu", input_shape=(8, 8, 1), num_classes=10)


def test_a_registered_gpt_is_created_for_a_language_model_task():
    build = lambda *, input_shape, num_classes, seed: gpt(
        input_shape[0], num_classes, layers=1, width=8, heads=2, seed=seed
    )
    models.register_model("test-user-gpt", build, overwrite=True)
    m = models.create("test-user-gpt", input_shape=(16,), num_classes=11, task="language_model")
    assert m(jnp.zeros((3, 16), jnp.int32)).shape == (3, 16, 11)
    with pytest.raises(ValueError, match=r"\(2, 11\) needed"):  # judged as a classifier
        models.create("test-user-gpt", input_shape=(16,), num_classes=11)


def test_a_sequence_longer_than_the_context_is_one_line():
    with pytest.raises(ValueError, match="sequences of 9 ids are longer than the context of 8"):
        gpt(8, 5, layers=1, width=8, heads=2)(jnp.zeros((1, 9), jnp.int32))


@pytest.mark.parametrize(
    ("ids", "words"),
    [
        (np.full((1, 4), 10), "token ids must be in [0, 10)"),  # NaN logits before
        (np.full((1, 4), -1), "got ids from -1 to -1"),  # accepted before
        (np.full((1, 4), 2.5, np.float32), "whole numbers"),  # truncated before
    ],
)
def test_ids_outside_the_vocabulary_are_one_line(ids, words):
    with pytest.raises(ValueError) as e:
        gpt(8, 10, **{**SMALL, "layers": 1})(jnp.asarray(ids))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_traced_ids_outside_the_vocabulary_fail_a_checkify_check():
    from jax.experimental import checkify

    from jaxstale import enable_traced_checks

    f = models.functional(gpt(8, 10, **{**SMALL, "layers": 1}))
    before = enable_traced_checks()
    try:
        run = jax.jit(checkify.checkify(lambda x: f.apply(f.params, f.state, x, False)[0]))
        err, _ = run(jnp.full((1, 4), 12))
        assert "token ids" in err.get() and "outside [0, 10)" in err.get()
        assert run(jnp.full((1, 4), 3))[0].get() is None
    finally:
        enable_traced_checks(before)


def test_gpt2_small_has_gpt2s_shape_whatever_the_data_and_splits_unevenly():
    """gpt2-small: 12 × 768, 12 heads, a 1,024 position table, nanoGPT's 50,304 ids: 163.2 M
    parameters (124 M + the untied output embedding); windows up to 1,024 ids and vocabularies
    up to 50,304 fit it, larger ones are one line; 12 blocks over 8 stages by parameter count:
    the embedding and head blocks alone, two middle blocks per stage after the third."""
    # abstract: shapes only (initialising and running 163 M parameters took 20 s of make test)
    model = nnx.eval_shape(lambda: models.create("gpt2-small", input_shape=(64,), num_classes=83))
    n = gpt_param_count(1024, 50304, layers=12, width=768)
    assert models.param_count(model) == n == 163_159_680
    assert n - 768 * 50304 == 124_526_208  # GPT-2 small with tied embeddings: 124 M
    assert [len(s.blocks) for s in models.split(model, 8)] == [1, 1, 1, 2, 2, 2, 2, 1]
    graph, state = nnx.split(model)
    logits = jax.eval_shape(lambda s: nnx.merge(graph, s)(jnp.zeros((1, 64), jnp.int32)), state)
    assert logits.shape == (1, 64, 50304)
    with pytest.raises(ValueError, match="up to 1024 ids over a vocabulary of up to 50,304"):
        models.create("gpt2-small", input_shape=(2048,), num_classes=83)
    with pytest.raises(ValueError, match="the data has 64 and 60,000"):
        models.create("gpt2-small", input_shape=(64,), num_classes=60_000)


def test_bfloat16_computes_the_products_in_bf16_and_keeps_float32_weights_and_loss():
    """Mixed precision: the same float32 weights (the master copy), bf16 matrix products,
    float32 logits; the loss and the gradient within bf16's rounding of float32's."""
    from jaxstale import losses

    x = jnp.asarray(np.random.default_rng(0).integers(0, 50, (4, 16)), jnp.int32)
    got = {}
    for dt in ("float32", "bfloat16"):
        f = models.functional(gpt(16, 50, layers=2, width=32, heads=2, dtype=dt))
        run = lambda p, f=f: f.apply(p, f.state, x, True)[0]
        loss = lambda p, run=run: losses.cross_entropy(run(p), x)
        # jitted: op by op, the eager GPT compiled each primitive alone (29 s of make test)
        got[dt] = (f.params, jax.jit(run)(f.params), *jax.jit(jax.value_and_grad(loss))(f.params))
        text = str(jax.make_jaxpr(run)(f.params))
        assert ("bf16" in text) == (dt == "bfloat16"), dt
    (p32, _, l32, g32), (p16, y16, l16, g16) = got["float32"], got["bfloat16"]
    assert all(
        bool(jnp.all(a == b))
        for a, b in zip(jax.tree.leaves(p32), jax.tree.leaves(p16), strict=True)
    )
    assert y16.dtype == jnp.float32 and {str(a.dtype) for a in jax.tree.leaves(g16)} == {"float32"}
    assert abs(float(l16 - l32)) < 1e-2
    num = sum(
        float(jnp.sum((a - b) ** 2))
        for a, b in zip(jax.tree.leaves(g32), jax.tree.leaves(g16), strict=True)
    )
    den = sum(float(jnp.sum(a**2)) for a in jax.tree.leaves(g32))
    assert (num / den) ** 0.5 < 0.05  # bf16's 8 mantissa bits: ~1 % here
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        gpt(16, 50, layers=1, width=32, heads=2, dtype="float16")
