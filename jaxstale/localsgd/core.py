"""The local-SGD family's core, shared by its two executors (:mod:`~jaxstale.localsgd.emulator`:
one device, lanes; :mod:`~jaxstale.localsgd.mesh`: workers on a ``"data"`` axis): a worker's job
of ``H`` inner steps, the exchange precisions, and the checks both executors make of a model, an
outer optimizer and Streaming DiLoCo's settings. Neither executor imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxstale.localsgd._trees import where as _where
from jaxstale.localsgd.schedule import LocalSchedule
from jaxstale.transforms.lookahead import uses_lookahead

__all__ = ["EXCHANGES", "check_lookahead", "check_model_state", "check_streaming", "inner_job"]

#: the pseudo-gradients' precision on the wire
EXCHANGES = ("fp32", "fp8", "fp4")


def inner_job(
    apply: Callable[..., tuple[jax.Array, Any]],
    inner_tx: optax.GradientTransformation,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array],
    p0: Any,
    s0: Any,
    steps: jax.Array,
    model_state: Any,
    batch_at: Callable[[jax.Array], tuple[Any, Any]],
    length: int,
    masked: bool,
) -> tuple[Any, Any, jax.Array]:
    """A worker's job: ``length`` inner steps from ``(p0, s0)`` on ``batch_at(i)`` (a
    ``lax.scan``), of which only the first ``steps`` apply when ``masked``. Returns ``(p, s,
    sum of the applied steps' losses)``."""

    def body(carry: tuple, i: jax.Array) -> tuple:
        p, s, total = carry
        x, y = batch_at(i)
        loss, g = jax.value_and_grad(lambda q: loss_fn(apply(q, model_state, x, True)[0], y))(p)
        u, s_new = inner_tx.update(g, s, p)
        p_new = optax.apply_updates(p, u)
        if not masked:
            return (p_new, s_new, total + loss), None
        on = i < steps
        return (_where(on, p_new, p), _where(on, s_new, s), total + jnp.where(on, loss, 0.0)), None

    (p, s, total), _ = jax.lax.scan(body, (p0, s0, jnp.float32(0.0)), jnp.arange(length))
    return p, s, total


def check_model_state(model_state: Any) -> None:
    """Raises ``ValueError`` for a model with non-parameter state (batch norm): the local-SGD
    executors would drop each worker's updated running statistics."""
    if jax.tree.leaves(model_state):
        raise ValueError(
            "the local-SGD executor takes models without non-parameter state (batch norm): "
            "each worker's running statistics would be dropped"
        )


def check_lookahead(outer_state: Any, synchronous: bool) -> None:
    """Raises ``ValueError`` for a momentum look-ahead outer optimizer
    (:func:`~jaxstale.transforms.lookahead.momentum_lookahead`) on a synchronous schedule: its
    pull point is for asynchronous workers, and synchronous rounds would ignore it."""
    if synchronous and uses_lookahead(outer_state):
        raise ValueError(
            "momentum_lookahead's pull point is for asynchronous schedules; a synchronous "
            "(or streaming, or overlapped) run would ignore it: use outer_nesterov there"
        )


def check_streaming(
    s0: LocalSchedule, fragments: int | Sequence[int] | None, overlap: int, alpha: float
) -> int:
    """The number of fragments ``P`` of a Streaming DiLoCo run, 0 when not streaming."""
    if fragments is None and overlap == 0 and alpha == 0.0:
        return 0
    if not s0.synchronous:
        raise ValueError(
            "fragments, overlap and alpha are Streaming DiLoCo's (synchronous schedules); "
            f"the {s0.name} schedule would ignore them"
        )
    if fragments is None:
        p = 1
    elif isinstance(fragments, bool):
        raise ValueError(f"fragments must be an int or one id per weight tensor, got {fragments}")
    elif isinstance(fragments, int):
        p = fragments
    else:
        p = max((int(i) for i in fragments), default=0) + 1
    if p < 1 or s0.inner_steps % p:
        raise ValueError(f"inner_steps {s0.inner_steps} must be a multiple of fragments {p}")
    if isinstance(overlap, bool) or not isinstance(overlap, int):
        raise ValueError(f"overlap must be an int, got {overlap!r}")
    if not 0 <= overlap < s0.inner_steps // p:
        raise ValueError(
            f"overlap must be in 0..{s0.inner_steps // p - 1} (H/P − 1), got {overlap}"
        )
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return p
