"""jaxstale.sizes: a pytree's bytes, from arrays or abstract shapes alike."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale.sizes import residual_bytes, tree_bytes


def test_counts_every_leaf_by_its_dtype():
    tree = {"a": np.zeros((2, 3), np.float32), "b": (jnp.zeros(5, jnp.bfloat16), np.int64(1))}
    assert tree_bytes(tree) == 2 * 3 * 4 + 5 * 2 + 8
    assert tree_bytes({}) == 0


def test_an_abstract_state_has_the_bytes_of_the_state_it_describes():
    params = {"w": jnp.ones((7, 3)), "b": jnp.ones(3)}
    tx = optax.adam(1e-3)
    abstract = jax.eval_shape(tx.init, params)
    assert tree_bytes(abstract) == tree_bytes(tx.init(params)) == 4 + 2 * 4 * (21 + 3)


def test_residuals_are_what_the_backward_reads_and_match_a_concrete_vjp():
    w = jnp.ones((16, 8))
    x = jnp.ones((4, 16))
    fn = lambda w, x: jnp.tanh(x @ w).sum()
    _, vjp = jax.vjp(fn, w, x)  # the residuals a real vjp keeps
    assert residual_bytes(fn, w, x) == tree_bytes(vjp) > 0
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    assert residual_bytes(fn, *abstract) == tree_bytes(vjp)  # nothing allocated
    assert residual_bytes(lambda w: w.sum(), w) == 0  # linear: nothing to keep
