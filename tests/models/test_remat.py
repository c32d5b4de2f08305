"""jaxstale.models.remat: smaller residual slots, the same gradients where the weights agree."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import loop, models, pipeline, schedules
from jaxstale.models.remat import REMAT, remat, remat_stages
from jaxstale.pipeline.kernel import split_residuals

N, NB = 3, 6


@pytest.fixture(scope="module")
def data():
    model = models.gpt(16, 20, layers=3, width=32, heads=2)
    stages = models.functional_stages(model, N)
    rng = np.random.default_rng(0)
    xb = rng.integers(0, 20, (NB, 4, 16)).astype(np.int32)
    return stages, xb, np.roll(xb, -1, -1)


def _losses(data, policy, name, backward="saved"):
    stages, xb, yb = data
    sched = schedules.one_f_one_b(N, NB)
    ex = pipeline.make(
        "emulate", stages, sched, policy, optax.adamw(3e-3), xb, yb, remat=name, backward=backward
    )
    (res,) = loop.run(ex, [s.params for s in stages], [s.state for s in stages])
    return np.asarray(res.losses)


def test_forward_unchanged_and_one_wrapper(data):
    stages = data[0]
    x = jnp.asarray(data[1][0])
    for name in REMAT:
        st = remat(stages[0], name)
        y = st.apply(st.params, st.state, x, True)[0]
        assert bool(jnp.all(y == stages[0].apply(stages[0].params, stages[0].state, x, True)[0]))
    assert remat(stages[0], "names").apply is remat(stages[0], "names").apply
    assert remat(stages[0], "none") is stages[0]


def test_bad_name_is_one_line(data):
    with pytest.raises(ValueError, match="remat must be one of none, names, dots, full"):
        remat_stages(data[0], "everything")


def test_slots_shrink_to_the_tagged_activations(data):
    """A middle GPT stage: jax.vjp keeps 37 residuals; "names" the five tagged arrays
    (the stage input is kept once, as the input) and every weight as itself."""
    st = data[0][1]
    x = jnp.zeros((4, 16, 32))
    seen = {}
    for name in ("none", "names", "full"):
        s = remat(st, name)

        def f(w, xx, s=s, name=name):
            y, vjp, _ = jax.vjp(lambda p, v: s.apply(p, s.state, v, True), w, xx, has_aux=True)
            _, kinds, rest = split_residuals(vjp, w, xx)
            seen[name] = (sum(k == "w" for k, _ in kinds), [tuple(a.shape) for a in rest])
            return y

        jax.jit(f)(st.params, x)
    assert len(seen["none"][1]) > 30
    assert sorted(seen["names"][1]) == sorted(
        [(4, 16, 32)] * 3 + [(4, 16, 96), (4, 16, 128)]
    )  # ln1, resid (mid), ln2, qkv, mlp_up
    assert seen["full"][1] == [] and seen["names"][0] > seen["none"][0]


@pytest.mark.slow  # eight short GPT pipeline runs (~1.5 min on 2 cores)
def test_stash_gradients_agree_and_full_is_recompute(data):
    """Where a backward reads its forward's weights every choice is the same training up to
    the rounding of recomputed values; "full" is backward="recompute" bit for bit."""
    base = _losses(data, "stash", "none")
    for name in ("names", "dots", "full"):
        np.testing.assert_allclose(_losses(data, "stash", name), base, rtol=0, atol=1e-5)
    full = _losses(data, "vanilla", "full")
    np.testing.assert_array_equal(full, _losses(data, "vanilla", "none", "recompute"))


def test_carried_bytes_follow(data):
    stages, xb, _ = data
    x = jax.ShapeDtypeStruct(xb.shape[1:], jnp.int32)
    sched = schedules.one_f_one_b(N, NB)
    size = {
        n: pipeline.carried_bytes(stages, sched, "vanilla", optax.adamw(1e-3), x, remat=n)
        for n in REMAT
    }
    assert size["none"] > 2 * size["names"] > 2 * size["full"]
