r"""Measuring a model's weights on a split, in eval mode: accuracy (classification) or the mean
next-token cross-entropy (language modelling), per lane of stacked weights.

:func:`measure` is what :func:`jaxstale.loop.run` calls for each evaluation split; the task's
metric (:mod:`jaxstale.tasks`) picks :func:`accuracy` or :func:`mean_loss`. Both run the model
with ``train=False`` in batches of ``batch_size`` with the last batch padded and masked, so one
compiled shape serves every batch. :func:`encode_correct` / :func:`decode_correct` store which
test examples a run classified correctly, :func:`encode_losses` / :func:`decode_losses` a
language model's loss on each test window, so that a report can resample the test set.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale._compile import jit
from jaxstale.losses import fixed_sum

__all__ = [
    "accuracy",
    "decode_correct",
    "decode_losses",
    "encode_correct",
    "encode_losses",
    "mean_loss",
    "measure",
]

Params = Any


@functools.lru_cache(maxsize=64)
def _counter(apply: Callable[..., Any], vmap: bool, each: bool) -> Callable[..., jax.Array]:
    def count(params, state, x, y, valid):
        logits, _ = apply(params, state, x, False)
        hit = (jnp.argmax(logits, axis=-1) == y) & valid
        return hit if each else jnp.sum(hit, dtype=jnp.int32)

    if vmap:
        count = jax.vmap(count, in_axes=(0, 0, None, None, None))
    return jit(count)


@functools.lru_cache(maxsize=64)
def _loss_sum(
    apply: Callable[..., Any], vmap: bool, each: bool = False
) -> Callable[..., jax.Array]:
    def total(params, state, x, y, valid):
        logits, _ = apply(params, state, x, False)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y)
        ce = jnp.where(valid.reshape(-1, *([1] * (ce.ndim - 1))), ce, 0.0)
        if each:  # one sum per example (a window's targets, in a fixed order)
            return fixed_sum(ce.reshape(len(ce), -1).T)
        return fixed_sum(ce.reshape(-1))  # every token of the batch, in a fixed order

    if vmap:
        total = jax.vmap(total, in_axes=(0, 0, None, None, None))
    return jit(total)


def _batched(x: Any, y: Any, batch_size: int) -> Iterator[tuple[Any, Any, Any, int]]:
    """``(x, y, valid, size)`` batches of one shape: the last padded (``valid`` False)."""
    x, y = np.asarray(x), np.asarray(y)
    n = len(x)
    if n == 0:
        raise ValueError("evaluation needs at least one example, got an empty x")
    if len(y) != n:
        raise ValueError(f"x has {n} examples but y has {len(y)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    bs = min(batch_size, n)
    nb = -(-n // bs)
    pad = nb * bs - n
    xp = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]) if pad else x
    yp = np.concatenate([y, np.zeros((pad, *y.shape[1:]), y.dtype)]) if pad else y
    valid = np.arange(nb * bs) < n
    for i in range(nb):
        sl = slice(i * bs, (i + 1) * bs)
        yield xp[sl], yp[sl], valid[sl], bs


def accuracy(
    apply: Callable[..., Any],
    params: Params,
    model_state: Any,
    x: Any,
    y: Any,
    *,
    vmap: bool = False,
    batch_size: int = 512,
    per_example: bool = False,
) -> np.ndarray:
    r"""Accuracy :math:`\frac{1}{N}\sum_i \mathbb{1}[\arg\max_c f(x_i)_c = y_i]`, eval mode.

    The model runs with ``train=False`` (batch-norm uses its running averages) in batches of
    ``batch_size``; the last batch is padded and masked, so one compiled shape serves all. The
    count of correct predictions is exact, so the accuracy does not depend on the batching.

    Args:
        apply: ``apply(params, state, x, train) -> (logits, new_state)``.
        params: the parameters (stacked ``[lanes, ...]`` when ``vmap``).
        model_state: the non-parameter state (same layout).
        x: inputs ``[N, ...]``.
        y: integer labels ``[N]``.
        vmap: the weights carry a leading lane axis (``jax.vmap`` over it).
        batch_size: evaluation batch size.
        per_example: return which examples are classified correctly instead.

    Returns:
        ``[lanes]`` float64 accuracies (``[1]`` without ``vmap``); with ``per_example``
        ``[lanes, N]`` booleans, whose mean over ``N`` is the accuracy bit for bit.

    Raises:
        ValueError: on empty or mismatched inputs, or ``batch_size < 1``.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from jaxstale.loop import accuracy
        >>> apply = lambda p, s, x, train: (x @ p, s)
        >>> accuracy(apply, jnp.eye(2), {}, np.eye(2), np.array([0, 0])).tolist()
        [0.5]
    """
    n = len(np.asarray(x))
    count = _counter(apply, vmap, per_example)
    parts: list[np.ndarray] = []
    total: Any = 0
    for xb, yb, valid, bs in _batched(x, y, batch_size):
        got = np.asarray(count(params, model_state, xb, yb, valid))
        if per_example:
            parts.append(got.reshape(-1, bs))
        else:
            total = total + got
    if per_example:
        return np.concatenate(parts, axis=1)[:, :n]
    return np.asarray(total, np.int64).reshape(-1) / n


def mean_loss(
    apply: Callable[..., Any],
    params: Params,
    model_state: Any,
    x: Any,
    y: Any,
    *,
    vmap: bool = False,
    batch_size: int = 512,
    per_example: bool = False,
) -> np.ndarray:
    r"""The mean cross-entropy over every target of the split, in nats, eval mode:
    :math:`\frac{1}{N T}\sum_{i, t} \big(\log \sum_c e^{z_{itc}} - z_{i t y_{it}}\big)` for
    next-token targets ``y [N, T]`` (or ``[N]``: a classifier's mean loss).

    Each batch's sum is a fixed-order float32 sum (:func:`jaxstale.losses.fixed_sum`), the
    batches are added in float64: a lane's value does not depend on the lanes beside it.
    With ``per_example``, each example's ``T`` targets are summed that way instead and divided
    by ``T``: :math:`\ell_i = \frac{1}{T}\sum_t (\dots)`, whose mean over ``i`` is the mean loss
    (every example has ``T`` targets) up to float32 rounding of the sums' order.

    Returns:
        ``[lanes]`` float64 mean losses (``[1]`` without ``vmap``); with ``per_example``
        ``[lanes, N]`` float64 per-example mean losses.

    Raises:
        ValueError: on empty or mismatched inputs, or ``batch_size < 1``.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from jaxstale.evaluation import mean_loss
        >>> apply = lambda p, s, x, train: (jnp.zeros((*x.shape, 4)) + p, s)  # uniform over 4
        >>> round(float(mean_loss(apply, 0.0, {}, np.zeros((3, 5), np.int32),
        ...                       np.ones((3, 5), np.int32))[0]), 4)   # log 4
        1.3863
    """
    y_arr = np.asarray(y)
    targets = int(np.prod(y_arr.shape[1:], dtype=np.int64))
    count = len(y_arr) * targets
    if per_example:
        each = _loss_sum(apply, vmap, True)
        parts = []
        for xb, yb, valid, bs in _batched(x, y_arr, batch_size):
            got = np.asarray(each(params, model_state, xb, yb, valid), np.float64)
            parts.append(got.reshape(-1, bs))
        return np.concatenate(parts, axis=1)[:, : len(y_arr)] / targets
    total = _loss_sum(apply, vmap)
    acc: Any = 0.0
    for xb, yb, valid, _ in _batched(x, y_arr, batch_size):
        acc = acc + np.asarray(total(params, model_state, xb, yb, valid), np.float64)
    return np.asarray(acc, np.float64).reshape(-1) / count


def measure(
    metric: str,
    apply: Callable[..., Any],
    params: Params,
    model_state: Any,
    x: Any,
    y: Any,
    *,
    vmap: bool = False,
    batch_size: int = 512,
) -> np.ndarray:
    """``metric`` (``"accuracy"`` or ``"loss"``) of the weights on ``(x, y)``, per lane."""
    if metric == "accuracy":
        return accuracy(apply, params, model_state, x, y, vmap=vmap, batch_size=batch_size)
    if metric == "loss":
        return mean_loss(apply, params, model_state, x, y, vmap=vmap, batch_size=batch_size)
    raise ValueError(f"unknown metric {metric!r}; choose from: accuracy, loss")


def encode_correct(correct: Any) -> str:
    """A boolean vector (which examples were classified correctly) as text: ``"<n>:"`` then
    base64 of its bits packed 8 to a byte, most significant first (:func:`decode_correct`).

    Example:
        >>> encode_correct([True, False, True]), decode_correct("3:oA==").tolist()
        ('3:oA==', [True, False, True])
    """
    bits = np.asarray(correct, bool).reshape(-1)
    return f"{len(bits)}:" + base64.b64encode(np.packbits(bits).tobytes()).decode("ascii")


def decode_correct(text: str) -> np.ndarray:
    """The boolean vector :func:`encode_correct` wrote.

    Raises:
        ValueError: text that :func:`encode_correct` did not write.
    """
    n, sep, data = text.partition(":")
    bits = np.unpackbits(np.frombuffer(base64.b64decode(data), np.uint8)) if sep else ()
    if not sep or not n.isdigit() or len(bits) != -(-int(n) // 8) * 8:
        raise ValueError(f"decode_correct: not an encoded vector: {text[:40]!r}")
    return np.asarray(bits[: int(n)], bool)


def encode_losses(losses: Any) -> str:
    """Per-example losses as text: ``"<n>:"`` then base64 of the values rounded to float16
    (little-endian; spacing ≤ 2⁻⁹ ≈ 0.002 nats below 4 nats, a 10th of a window's typical
    spread between two runs): what a report needs to resample the test windows — the variance
    of a difference, never the mean, which the run records at full precision.
    :func:`decode_losses` reads it.

    A loss that is not finite, or beyond float16's 65,504, is stored as NaN or inf (a window
    a run scores that badly is recorded as such; :func:`study.verdicts.contrast_variance`
    then counts its test set as fixed).

    Example:
        >>> encode_losses([1.5, 2.0]), decode_losses("2:AD4AQA==").tolist()
        ('2:AD4AQA==', [1.5, 2.0])
    """
    v = np.asarray(losses, np.float64).reshape(-1)
    with np.errstate(over="ignore"):
        half = v.astype("<f2")
    return f"{len(v)}:" + base64.b64encode(half.tobytes()).decode("ascii")


def decode_losses(text: str) -> np.ndarray:
    """The float64 vector :func:`encode_losses` wrote.

    Raises:
        ValueError: text that :func:`encode_losses` did not write.
    """
    n, sep, data = text.partition(":")
    raw = base64.b64decode(data) if sep else b""
    if not sep or not n.isdigit() or len(raw) != 2 * int(n):
        raise ValueError(f"decode_losses: not encoded losses: {text[:40]!r}")
    return np.frombuffer(raw, "<f2").astype(np.float64)
