"""The language-model optimizers (``jaxstale.optimizers``): schedule, decay on matrices only,
per-stage clipping, Muon on the hidden matrices and AdamW on embeddings, head and vectors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import models, optimizers


def _step(tx, params, grads):
    updates, _ = tx.update(grads, tx.init(params), params)
    return updates


def test_schedule_warms_up_then_decays_and_refuses_bad_steps():
    s = optimizers.schedule(0.1, 1000, warmup_steps=100, final_fraction=0.0)
    assert float(s(50)) == pytest.approx(0.05) and float(s(100)) == pytest.approx(0.1)
    assert float(s(550)) == pytest.approx(0.05, rel=1e-3) and float(s(1000)) == pytest.approx(0)
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        optimizers.schedule(0.1, 10, warmup_steps=10)


def test_weight_decay_reaches_matrices_not_vectors():
    params = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
    zero = jax.tree.map(jnp.zeros_like, params)
    for tx in (optimizers.adamw(0.1, 10), optimizers.nadamw(0.1, 10)):
        u = _step(tx, params, zero)
        assert float(jnp.abs(u["b"]).max()) == 0 and float(u["w"][0, 0]) < 0


def test_the_stage_gradient_is_clipped_to_its_own_norm():
    params = {"w": jnp.zeros((2, 2))}
    g = {"w": jnp.full((2, 2), 5.0)}  # norm 10
    u = _step(optimizers.sgd(0.1, 10, momentum=0.0, clip=1.0), params, g)
    np.testing.assert_allclose(np.asarray(u["w"]), -0.1 * 0.5, rtol=1e-6)  # g / 10 · lr
    u = _step(optimizers.sgd(0.1, 10, momentum=0.0, clip=None), params, g)
    np.testing.assert_allclose(np.asarray(u["w"]), -0.5, rtol=1e-6)


def test_muon_takes_the_hidden_matrices_and_leaves_embeddings_head_and_vectors():
    f = models.functional(models.gpt(8, 20, layers=2, width=16, heads=2))
    dims = optimizers._muon_dims(optimizers.EXCLUDE)(f.params)
    on = {
        jax.tree_util.keystr(k)
        for k, v in jax.tree_util.tree_leaves_with_path(
            dims, is_leaf=lambda x: x is None or hasattr(x, "reduction_axis")
        )
        if v is not None
    }
    assert on and all("kernel" in k for k in on)
    assert not any(n in k for k in on for n in ("tokens", "positions", "out"))
    assert {k for k in on if "qkv" in k or "proj" in k or "up" in k or "down" in k} == on


@pytest.mark.slow  # 10 s (Newton–Schulz compiles); the label test above stays in make test
def test_muon_orthogonalises_hidden_matrices_and_adam_steps_the_rest():
    f = models.functional(models.gpt(8, 20, layers=2, width=16, heads=2))
    rng = np.random.default_rng(0)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), f.params)
    tx = optimizers.muon(0.02, 10, adam_peak=0.001, weight_decay=0.0, clip=None)
    u = _step(tx, f.params, grads)
    flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(u)}
    gflat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(grads)}
    hidden = next(k for k in flat if "qkv" in k and "kernel" in k)
    sv = np.linalg.svd(np.asarray(flat[hidden]), compute_uv=False)
    assert sv.max() / sv.min() < 2  # Newton–Schulz: nearly orthogonal (raw gradient: ≫ 2)
    raw = np.linalg.svd(np.asarray(gflat[hidden]), compute_uv=False)
    assert raw.max() / raw.min() > 2
    # the rest on optax.contrib.muon's Adam branch, Nesterov's (NAdamW): the first step is
    # −lr · (1 + β1(1 − β1) / (1 − β1²)) · sign(g), β1 = 0.9
    nesterov = 1 + 0.9 * 0.1 / (1 - 0.81)
    for name in ("tokens", "out", "bias"):
        key = next(k for k in flat if name in k)
        want = -0.001 * nesterov * np.sign(np.asarray(gflat[key]))
        np.testing.assert_allclose(np.asarray(flat[key]), want, rtol=1e-3)


@pytest.mark.parametrize(
    "name",
    ["adamw", "nadamw", pytest.param("muon", marks=pytest.mark.slow)],  # muon: 3 s
)
def test_injected_is_the_optimizer_at_its_peak_and_lanes_take_their_own(name):
    """The unit-peak schedule scaled by the injected rate is the optimizer at that peak (to
    float32 rounding), and vmapped lanes with their own rates equal their runs alone."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)}
    grads = [{"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)} for _ in range(5)]
    direct = {
        "adamw": lambda lr: optimizers.adamw(lr, 20, warmup_steps=1),
        "nadamw": lambda lr: optimizers.nadamw(lr, 20, warmup_steps=1, b1=0.9),
        "muon": lambda lr: optimizers.muon(lr, 20, warmup_steps=1, beta=0.9),
    }[name]

    def run(tx, p):
        def body(p, g):
            p, st = p
            u, st = tx.update(g, st, p)
            return (optax.apply_updates(p, u), st), None

        stacked = jax.tree.map(lambda *a: jnp.stack(a), *grads)
        return jax.jit(lambda p: jax.lax.scan(body, (p, tx.init(p)), stacked)[0][0])(p)

    for lr in (0.003, 0.03):
        got = run(optimizers.injected(name, lr, steps=20), params)
        np.testing.assert_allclose(got["w"], run(direct(lr), params)["w"], rtol=1e-5, atol=1e-7)
    tx = optimizers.injected(name, 0.003, steps=20)

    def lane(lr, p):
        st = tx.init(p)
        st.hyperparams["learning_rate"] = lr
        for g in grads:
            u, st = tx.update(g, st, p)
            p = optax.apply_updates(p, u)
        return p

    both = jax.jit(jax.vmap(lane))(
        jnp.array([0.003, 0.03]), jax.tree.map(lambda a: jnp.stack([a, a]), params)
    )
    for i, lr in enumerate((0.003, 0.03)):
        alone = run(optimizers.injected(name, lr, steps=20), params)
        np.testing.assert_allclose(both["w"][i], alone["w"], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimizers.injected("lamb", 0.1, steps=10)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("call", "where", "argument"),
    [
        # accepted before (issue 51's user reports): each trained to NaN or grew the weights
        (lambda: optimizers.adamw(-3e-3, 50), "adamw", "peak"),
        (lambda: optimizers.adamw(NAN, 50), "adamw", "peak"),
        (lambda: optimizers.nadamw(INF, 50), "nadamw", "peak"),
        (lambda: optimizers.muon(-0.02, 100), "muon", "peak"),
        (lambda: optimizers.muon(0.02, 100, adam_peak=NAN), "muon", "adam_peak"),
        (lambda: optimizers.schedule(-1.0, 100), "schedule", "peak"),
        (lambda: optimizers.schedule(1.0, 100, final_fraction=-1.0), "schedule", "final_fraction"),
        (lambda: optimizers.adamw(1e-3, 50, b1=1.5), "adamw", "b1"),
        (lambda: optimizers.adamw(1e-3, 50, weight_decay=-1.0), "adamw", "weight_decay"),
        (lambda: optimizers.adamw(1e-3, 50, clip=0.0), "adamw", "clip"),
        (lambda: optimizers.muon(0.02, 100, beta=2.0), "muon", "beta"),
    ],
)
def test_out_of_range_hyperparameters_are_one_clear_line(call, where, argument):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value).startswith(f"{where}: {argument} must be in "), str(e.value)
    assert "\n" not in str(e.value)
