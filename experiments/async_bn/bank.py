"""The statistics bank of :mod:`experiments.async_bn`: every batch-norm policy's running
statistics carried through one training run, the server's merge of them, the emulator and
executor that train with a bank, and the evaluation of every policy copy.

A bank is ``{"model": s, "ordinary": (s, ...), "async-bn": (s, ...)}``: the model's own copy
(whose update recovers the worker's batch statistics) and one copy per policy and rate ``d``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstale import delays, loop
from jaxstale._compile import memo
from jaxstale.asyncdp import emulator as _emulator
from jaxstale.asyncdp.bn import batch_stats_from_update, merge_batch_stats, recompute_batch_stats
from jaxstale.asyncdp.methods import LC_BN_MOMENTUM as BN_MOMENTUM
from jaxstale.asyncdp.methods import MethodSpec, build_lc_asgd

ORDINARY, ASYNC, RECOMPUTED = "ordinary", "async-bn", "recomputed"
POLICIES = (ORDINARY, ASYNC)  # the running-statistics policies (each at every decay)
DEFAULT_DECAY = round(1.0 - BN_MOMENTUM, 6)  # the model's own rate: ordinary BN's, Async-BN's


def _label(policy: str, decay: float | None) -> str:
    """A policy copy's name in the records and figures: ``"<policy> d=<d>"``, or the policy
    alone (the recomputed statistics, which have no rate)."""
    return policy if decay is None else f"{policy} d={decay:g}"


# ----------------------------------------------------------------------------- the statistics bank


def bank_apply(apply: Callable[..., Any]) -> Callable[..., Any]:
    """``apply`` on a bank ``{"model": s, "ordinary": (s, ...), "async-bn": (s, ...)}``: the
    forward pass reads and advances the model's copy only; the policies' copies are left to
    the server's merge (:func:`bank_merge`). One wrapper per ``apply`` (one compile)."""

    def wrapped(params: Any, bank: Any, x: Any, train: bool) -> tuple[Any, Any]:
        logits, new = apply(params, bank["model"], x, train)
        return logits, {**bank, "model": new}

    return memo("async_bn.bank_apply", (id(apply),), lambda: wrapped, keep=apply)


def init_bank(model_state: Any, num_decays: int) -> dict[str, Any]:
    """The initial bank: every copy is the model's initial statistics."""
    return {
        "model": model_state,
        ORDINARY: (model_state,) * num_decays,
        ASYNC: (model_state,) * num_decays,
    }


def bank_merge(decays: Sequence[float], momentum: float = BN_MOMENTUM) -> Callable[..., Any]:
    """The server's ``merge_model_state`` for a bank: with ``b`` the worker's batch statistics
    (recovered from its update of the model's copy), ordinary copy ``k`` becomes
    ``(1 − d_k)·pulled + d_k·b`` (last writer wins) and Async-BN copy ``k``
    ``(1 − d_k)·server + d_k·b``."""
    ds = [float(d) for d in decays]

    def merge(server: Any, pulled: Any, returned: Any) -> Any:
        b = batch_stats_from_update(pulled["model"], returned["model"], momentum)
        return {
            "model": returned["model"],
            ORDINARY: tuple(
                merge_batch_stats(e, b, d) for e, d in zip(pulled[ORDINARY], ds, strict=True)
            ),
            ASYNC: tuple(
                merge_batch_stats(e, b, d) for e, d in zip(server[ASYNC], ds, strict=True)
            ),
        }

    return merge


def bank_emulator(apply: Callable[..., Any], cfg: dict[str, Any], vmap: bool) -> Any:
    """One compiled emulator for every run of the sweep (lr, M and seed are traced lanes)."""
    key = (id(apply), cfg["lam"], cfg["momentum"], tuple(cfg["decays"]), max(cfg["workers"]), vmap)

    def make() -> _emulator.AsyncEmulator:
        lam, merge = cfg["lam"], bank_merge(cfg["decays"])
        build = lambda hp: MethodSpec(build_lc_asgd(hp, lam=lam), merge_model_state=merge)
        return _emulator.AsyncEmulator(
            bank_apply(apply), build, max(cfg["workers"]), momentum=cfg["momentum"], vmap=vmap
        )

    return memo("async_bn.emulator", key, make, keep=apply)


def _timing(s: delays.DelaySchedule) -> dict[str, np.ndarray]:
    """LC-ASGD's per-update arguments of a timed schedule (as :func:`jaxstale.asyncdp.make`)."""
    if s.start_time is None or s.finish_time is None:
        return {}
    return {
        "t_comm": s.start_time.astype(np.float32),
        "t_comp": (s.finish_time - s.start_time).astype(np.float32),
    }


def bank_executor(
    emu: Any,
    scheds: Sequence[delays.DelaySchedule],
    xs: Sequence[Any],
    ys: Sequence[Any],
    *,
    learning_rate: Sequence[float],
) -> loop.Executor:
    """The executor of runs (lanes of ``emu``) from their schedules, streams and rates, as
    :func:`jaxstale.asyncdp.make` builds it for asynchronous methods, on a shared emulator."""
    extras = [_timing(s) for s in scheds]
    return _emulator.executor(
        emu,
        [s.batch for s in scheds],
        np.stack([s.worker for s in scheds]),
        np.stack([s.staleness for s in scheds]),
        {k: np.stack([e[k] for e in extras]) for k in extras[0]},
        list(xs),
        list(ys),
        learning_rate=list(learning_rate),
        num_workers=[s.num_workers for s in scheds],
        batches_per_update=1,
    )


def _bank_correct(apply: Callable[..., Any]) -> Callable[..., Any]:
    """Jitted: the number of correct predictions of every policy copy of a bank (eval mode)."""

    def count(params: Any, bank: Any, x: Any, y: Any) -> jax.Array:
        copies = [*bank[ORDINARY], *bank[ASYNC]]
        hits = [jnp.argmax(apply(params, s, x, False)[0], -1) == y for s in copies]
        return jnp.stack([jnp.sum(h, dtype=jnp.int32) for h in hits])

    return memo("async_bn.count", (id(apply),), lambda: jax.jit(count), keep=apply)


def _recompute(apply: Callable[..., Any]) -> Callable[..., Any]:
    fn = lambda p, s, x: recompute_batch_stats(apply, p, s, x, momentum=BN_MOMENTUM)
    return memo("async_bn.recompute", (id(apply),), lambda: jax.jit(fn), keep=apply)


def _policy_labels(cfg: dict[str, Any]) -> list[tuple[str, float]]:
    """The bank's policy copies in evaluation order."""
    return [(p, d) for p in POLICIES for d in cfg["decays"]]


def _evaluate(
    apply: Callable[..., Any], cfg: dict[str, Any], params: Any, bank: Any, x: Any, y: Any
) -> dict[tuple[str, float | None], float]:
    got = np.asarray(_bank_correct(apply)(params, bank, jnp.asarray(x), jnp.asarray(y)))
    return {lab: int(c) / len(y) for lab, c in zip(_policy_labels(cfg), got, strict=True)}
