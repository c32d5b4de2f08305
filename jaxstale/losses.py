"""Classification losses and metrics on logits and integer labels.

Both functions take ``logits`` of shape ``[B, C]`` and integer ``labels`` of shape ``[B]`` and
return a scalar, so they can be used directly inside a jitted training step.

The loss averages over the batch with :func:`batch_mean`, a sum in a fixed order made of
element-wise additions: a run's loss values are then the same bits whether it is computed alone,
as one lane of a ``jax.vmap`` over runs, or on a mesh. ``jnp.mean`` lowers to an XLA ``reduce``
whose summation order XLA:CPU picks per program (measured: a ``[32]`` → scalar reduce fused into
a value-and-grad step rounds differently from the same reduce as one row of a vmapped ``[L,
32]`` → ``[L]`` one, in 2 of 16 lanes), which LC-ASGD, feeding the worker's loss into its
update, turns into different weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

__all__ = ["accuracy", "batch_mean", "cross_entropy", "fixed_sum"]


def fixed_sum(values: jax.Array) -> jax.Array:
    r"""The sum over the leading axis in a fixed order: pairwise halving by element-wise
    additions, ``v[:h] + v[h:2h]`` then the same on the result (an odd element out is carried to
    the next level's end).

    Element-wise additions are exactly rounded wherever XLA runs them, so the result does not
    depend on the program around it (lanes of a ``jax.vmap``, fusion, device), where
    ``jnp.sum`` lowers to a ``reduce`` whose order XLA:CPU picks per program.

    Args:
      values: ``[B, ...]``, ``B ≥ 1``.

    Returns:
      ``[...]``: the sum of ``values`` over its first axis.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale.losses import fixed_sum
      >>> float(fixed_sum(jnp.arange(5.0)))
      10.0
    """
    v = jnp.asarray(values)
    if v.shape[0] == 0:
        raise ValueError("fixed_sum: an empty axis")
    while v.shape[0] > 1:
        h = v.shape[0] // 2
        head = v[:h] + v[h : 2 * h]
        v = head if v.shape[0] % 2 == 0 else jnp.concatenate([head, v[2 * h :]])
    return v[0]


def batch_mean(values: jax.Array) -> jax.Array:
    r"""The mean over the leading axis: :func:`fixed_sum` divided by ``B``; its gradient is
    ``1/B`` per element, bit for bit ``jnp.mean``'s.

    Args:
      values: ``[B, ...]``, ``B ≥ 1``.

    Returns:
      ``[...]``: the mean of ``values`` over its first axis.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale.losses import batch_mean
      >>> float(batch_mean(jnp.arange(5.0)))
      2.0
    """
    v = jnp.asarray(values)
    if v.shape[0] == 0:
        raise ValueError("batch_mean: an empty batch has no mean")
    return fixed_sum(v) / jnp.asarray(v.shape[0], v.dtype)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Mean softmax cross-entropy with integer labels.

    .. math::

        \mathcal{L} = \frac{1}{B} \sum_{i=1}^{B}
            \Big(\log \sum_{c=1}^{C} e^{z_{ic}} - z_{i, y_i}\Big)

    A sequence model's next-token targets (``logits [B, T, V]``, ``labels [B, T]``) are
    averaged over every target: each example's mean over its ``T`` positions (a
    :func:`fixed_sum` divided by ``T``), then the batch mean.

    Args:
      logits: ``[B, C]`` unnormalised log-probabilities ``z`` (or ``[B, T, C]``).
      labels: ``[B]`` integer class indices ``y`` in ``[0, C)`` (or ``[B, T]``).

    Returns:
      The scalar mean loss (float32 for float32 logits), averaged by :func:`batch_mean`.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale.losses import cross_entropy
      >>> logits = jnp.array([[0.0, 0.0], [0.0, 0.0]])
      >>> print(f"{float(cross_entropy(logits, jnp.array([0, 1]))):.4f}")  # log 2
      0.6931
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    if ce.ndim > 1:  # [B, T, ...] -> [B]: the positions' mean, in a fixed order
        per = ce.reshape(ce.shape[0], -1)
        ce = fixed_sum(per.T) / jnp.asarray(per.shape[1], per.dtype)
    return batch_mean(ce)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Fraction of examples whose arg-max logit is the label.

    .. math::

        \mathrm{acc} = \frac{1}{B} \sum_{i=1}^{B} \mathbb{1}\big[\arg\max_c z_{ic} = y_i\big]

    Args:
      logits: ``[B, C]`` logits.
      labels: ``[B]`` integer class indices.

    Returns:
      A float32 scalar in ``[0, 1]``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale.losses import accuracy
      >>> logits = jnp.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])
      >>> float(accuracy(logits, jnp.array([0, 1, 1, 1])))
      0.75
    """
    return jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
