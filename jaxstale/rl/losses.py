r"""Off-policy corrections for stale rollouts, as pure policy-gradient losses.

Every loss takes, per response id (``[n, L]``): ``logp`` the log-probability under the policy
being trained (the only input with a gradient), ``behav`` the behaviour policy's (the version
that generated the id, :class:`~jaxstale.rl.sampler.Rollout`'s ``logp``), the advantages ``adv``
(``[n]``, one per response, or ``[n, L]``) and a ``mask`` of the ids that count (default all).
It returns ``(loss, Stats)``; ``jax.grad`` of the loss is the correction's policy gradient.
With :math:`r_t = \pi_\theta / \pi_\mathrm{behav} = e^{\log p_t - \log b_t}` (log-ratios
clamped to ±20 before ``exp``, as verl does), :math:`\mathrm{sg}` the stop-gradient and
:math:`\mathrm{agg}` the token mean over the mask (the default of verl and AReaL):

* :func:`reinforce` — no correction: :math:`-\mathrm{agg}(A_t \cdot e^{\log p_t -
  \mathrm{sg}\log p_t})`, the on-policy gradient :math:`A \nabla \log p` whatever the
  behaviour was;
* :func:`ppo_clip` — PPO-clip against the behaviour policy (verl's bypass mode):
  :math:`\max(-A r, -A\,\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h))`, and where
  :math:`A < 0` at most :math:`-A c` (dual clip, ``c = 3``);
* :func:`tis` — truncated importance sampling, REINFORCE weighted by
  :math:`\mathrm{sg}(\min(w, C))`, ``w`` the token's ratio or its sequence's product
  :math:`e^{\sum_t (\log p_t - \log b_t)}` (``level="sequence"``), ``C = 2``;
* :func:`icepop` — masking instead of truncation: the weight is ``w`` inside ``[0.5, 5]`` and
  0 outside (the masked ids still count in the token mean);
* :func:`mis` — masked importance sampling by sequence (verl's Seq-MIS): sequence TIS with
  ``C = 2``, and a sequence whose ratio leaves ``[0.5, 2]`` removed from the loss and its mean;
* :func:`decoupled_ppo` — AReaL's decoupled PPO: a proximal policy ``prox`` carries the trust
  region, :math:`\max(-A u, -A\,\mathrm{clip}(u, 1 \pm \epsilon))` with :math:`u = \pi_\theta
  / \pi_\mathrm{prox}`, times the behaviour weight :math:`\pi_\mathrm{prox} / \pi_\mathrm{behav}`
  (0 above 5: masked, the paper's code);
* :func:`m2po` — M2PO's second-moment trust region: the ids with the largest
  :math:`(\log r)^2` masked, fewest first, until the rest's mean :math:`M_2 < 0.04`; then
  :math:`-r A` on the rest, averaged over every id (the paper's :math:`1 / \sum_i |o_i|`);
* :func:`m2po_clip` — M2PO as its authors' code runs it: PPO-clip whose bounds
  :math:`e^{\mp c}` are set per batch so that capping the harmful ids' :math:`(\log r)^2`
  at :math:`c^2` brings their :math:`M_2` within 0.04;
* :func:`vcpo` — VCPO's loss (sequence TIS, ``C = 8``, averaged per sequence then over
  sequences) and :func:`ess_ratio`, the effective sample size of the sequences' weights over
  their number, which :func:`scale_by_ess` turns into the step's rate
  :math:`\eta \sqrt{\min(1, \rho)}`.

At ``behav = logp`` (on-policy: the behaviour version is the trained one) every ratio and
weight is 1 and every loss's gradient is :func:`reinforce`'s (tested bit for bit).

References:
    Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347 (2017).
    Yao, Liu et al., "Your efficient RL framework secretly brings you off-policy RL
    training" (2025); verl-project/verl ``verl/trainer/ppo/rollout_corr_helper.py``
    (``compute_rollout_correction_weights``) and ``core_algos.py``
    (``compute_policy_loss_vanilla``) at 1dda039b9c6311889a9c9a26040677e1254814f9.
    Ling Team, "Ring-1T" (IcePop), arXiv 2510.18855 (2025); verl's port, preset
    ``decoupled_token_icepop(threshold=5.0, threshold_lower=0.5)``.
    Fu et al., "AReaL: a large-scale asynchronous reinforcement learning system", arXiv
    2505.24298 (2025); inclusionAI/AReaL ``areal/utils/functional/functional.py``
    (``ppo_actor_loss_fn``) at 61d1bbb3d5c8891a76f5c461a5e1fde1dbf0270a.
    Zheng, Zhao, Chen, "Prosperity before Collapse: how far can off-policy RL reach with
    stale data" (M2PO), ICLR 2026, arXiv 2510.01161; the masking rule as AReaL ports it
    (``areal/trainer/ppo/actor.py``, ``_get_m2po_loss_mask``, 4aef98d8d818af55b43621aaadba047
    ae10f4e77); the authors' adaptive clip as Infini-AI-Lab/M2PO
    ``verl/trainer/ppo/core_algos.py`` (``kpo_clip_harmful_tokens``,
    ``compute_m2po_policy_loss``) at 4514ce22cc5af605b150d3bb7d0deab82f783acd runs it
    (``M2_budget=0.04``, no ``miniclip`` floor, in ``train-scripts/m2po-*.sh``).
    Huang et al., VCPO, ICML 2026, arXiv 2602.17616; mit-han-lab/vcpo
    ``recipe/fully_async_policy/staleness_utils.py`` (``compute_ess_info``) at
    c7f030f0b77237cfb0e75e720669e2917a1bb56e.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale._checks import check_range

__all__ = [
    "CORRECTIONS",
    "ScaleByESSState",
    "Stats",
    "decoupled_ppo",
    "ess_ratio",
    "icepop",
    "m2po",
    "m2po_clip",
    "m2po_clip_bounds",
    "m2po_mask",
    "mis",
    "ppo_clip",
    "reinforce",
    "scale_by_ess",
    "tis",
    "vcpo",
]

#: the log-ratio clamp before ``exp`` (verl's ``SAFETY_BOUND``)
BOUND = 20.0

sg = jax.lax.stop_gradient


class Stats(NamedTuple):
    """What a correction did to the batch: the fraction of counted ids it kept (masking),
    the fraction it clipped or truncated, and the mean weight it put on the counted ids."""

    kept: jax.Array
    clipped: jax.Array
    weight: jax.Array


def _check_behaviour(behav: Any) -> None:
    """The behaviour log-probabilities must be given, finite and ≤ 0 (checked when concrete:
    a missing one — None, or NaN where a stack left a gap — would weight its id by NaN)."""
    if behav is None:
        raise ValueError(
            "behaviour log-probabilities missing: pass the sampler's Rollout.logp (the "
            "log-probability of each id under the policy that generated it)"
        )
    if isinstance(behav, jax.core.Tracer):
        return
    b = np.asarray(jax.device_get(behav), np.float64)
    if not np.isfinite(b).all():
        raise ValueError(
            f"behaviour log-probabilities missing: {int((~np.isfinite(b)).sum())} of {b.size} "
            "are not finite (each id needs the log-probability it was drawn with)"
        )
    if (b > 1e-6).any():
        raise ValueError(f"behaviour log-probabilities must be <= 0, got a maximum of {b.max():g}")


def _inputs(logp: Any, behav: Any, adv: Any, mask: Any, where: str) -> tuple[jax.Array, ...]:
    """``(logp, behav, adv, mask)`` as float32 ``[n, L]`` arrays, each checked against
    ``logp``'s shape in one line starting with ``where`` (``adv`` per sequence ``[n]`` or per
    id ``[n, L]``)."""
    try:
        return _checked_inputs(logp, behav, adv, mask)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _checked_inputs(logp: Any, behav: Any, adv: Any, mask: Any) -> tuple[jax.Array, ...]:
    _check_behaviour(behav)
    logp = jnp.asarray(logp, jnp.float32)
    behav = sg(jnp.asarray(behav, jnp.float32))
    if logp.ndim != 2:
        raise ValueError(
            f"log-probabilities must be [responses, ids], got shape {tuple(logp.shape)}"
        )
    if behav.shape != logp.shape:
        raise ValueError(
            f"behaviour log-probabilities {tuple(behav.shape)} for log-probabilities "
            f"{tuple(logp.shape)}: one per response id"
        )
    adv = sg(jnp.asarray(adv, jnp.float32))
    if adv.shape not in ((logp.shape[0],), logp.shape):
        raise ValueError(
            f"advantages {tuple(adv.shape)} for log-probabilities {tuple(logp.shape)}: one "
            "per response, or one per response id"
        )
    if adv.ndim == 1:
        adv = adv[:, None]
    adv = jnp.broadcast_to(adv, logp.shape)
    mask = jnp.ones(logp.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    if mask.shape != logp.shape:
        raise ValueError(
            f"mask {tuple(mask.shape)} for log-probabilities {tuple(logp.shape)}: one per "
            "response id"
        )
    return logp, behav, adv, mask


def _mean(x: jax.Array, mask: jax.Array, count: jax.Array | None = None) -> jax.Array:
    """The token mean over ``mask`` (over ``count`` ids when given)."""
    n = jnp.sum(mask) if count is None else count
    return jnp.sum(x * mask) / jnp.maximum(n, 1.0)


def _log_ratio(logp: jax.Array, behav: jax.Array) -> jax.Array:
    return jnp.clip(sg(logp) - behav, -BOUND, BOUND)


def _seq_log_ratio(logp: jax.Array, behav: jax.Array, mask: jax.Array) -> jax.Array:
    """Each sequence's summed log-ratio, clamped (the sum, not each id), ``[n, 1]``."""
    s = jnp.sum((sg(logp) - behav) * mask, axis=1, keepdims=True)
    return jnp.clip(s, -BOUND, BOUND)


def _score(logp: jax.Array) -> jax.Array:
    """``exp(logp − sg(logp))``: 1 in value, ``∇ log p`` in gradient."""
    return jnp.exp(logp - sg(logp))


def _stats(kept: jax.Array, clipped: jax.Array, weight: jax.Array, mask: jax.Array) -> Stats:
    return Stats(_mean(kept, mask), _mean(clipped, mask), _mean(weight, mask))


def _surrogate(
    adv: jax.Array, r: jax.Array, lo: float | jax.Array, hi: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate ``max(−A·r, −A·clip(r, lo, hi))`` and where the clip won."""
    l1, l2 = -adv * r, -adv * jnp.clip(r, lo, hi)
    return jnp.maximum(l1, l2), (l2 > l1).astype(jnp.float32)


def _check_cap(name: str, cap: float) -> None:
    """A truncation cap: > 0 (``inf``: no truncation)."""
    if cap != math.inf:
        check_range(cap, "cap", name, 0.0, low_open=True, hint=" (or inf: no truncation)")


def _band(name: str, low: float, high: float) -> None:
    """``0 ≤ low < high``, in one line."""
    if not (float(low) >= 0.0 and float(high) > float(low)):
        raise ValueError(f"{name}: need 0 <= low < high, got low {low}, high {high}")


def _check_dual(name: str, dual_clip: float | None) -> None:
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"{name}: dual_clip must be > 1 (or None), got {dual_clip}")


def _clipped_loss(
    logp: jax.Array, behav: jax.Array, adv: jax.Array, mask: jax.Array,
    lo: float | jax.Array, hi: float | jax.Array, dual_clip: float | None,
) -> tuple[jax.Array, Stats]:  # fmt: skip
    """PPO's clipped surrogate at ratio bounds ``[lo, hi]`` (inputs already through
    :func:`_inputs`), and where ``A < 0`` at most ``−A·dual_clip`` (None: no dual clip)."""
    r = jnp.exp(jnp.clip(logp - behav, -BOUND, BOUND))
    loss, clipped = _surrogate(adv, r, lo, hi)
    if dual_clip is not None:
        loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
    return _mean(loss, mask), _stats(jnp.ones_like(r), clipped, sg(r), mask)


def reinforce(logp: Any, behav: Any, adv: Any, mask: Any = None) -> tuple[jax.Array, Stats]:
    """No correction: the on-policy surrogate, whatever generated the ids (``behav`` only
    checked for shape)."""
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "reinforce")
    one = jnp.ones_like(logp)
    return _mean(-adv * _score(logp), mask), _stats(one, 0 * one, one, mask)


def ppo_clip(
    logp: Any,
    behav: Any,
    adv: Any,
    mask: Any = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, Stats]:
    """PPO-clip with the behaviour policy as the old policy (``dual_clip`` None: off; it must
    exceed 1)."""
    _check_dual("ppo_clip", dual_clip)
    check_range(eps_low, "eps_low", "ppo_clip", 0.0, 1.0, high_open=False)
    check_range(eps_high, "eps_high", "ppo_clip", 0.0)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "ppo_clip")
    return _clipped_loss(logp, behav, adv, mask, 1.0 - eps_low, 1.0 + eps_high, dual_clip)


def tis(
    logp: Any,
    behav: Any,
    adv: Any,
    mask: Any = None,
    *,
    cap: float = 2.0,
    level: Literal["token", "sequence"] = "token",
) -> tuple[jax.Array, Stats]:
    """Truncated importance sampling: REINFORCE weighted by ``sg(min(w, cap))``."""
    _check_cap("tis", cap)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "tis")
    w = _weights(logp, behav, mask, level)
    wt = jnp.minimum(w, cap)
    clipped = (w > cap).astype(jnp.float32)
    return _mean(-adv * wt * _score(logp), mask), _stats(jnp.ones_like(w), clipped, wt, mask)


def _weights(logp: jax.Array, behav: jax.Array, mask: jax.Array, level: str) -> jax.Array:
    if level == "token":
        return jnp.exp(_log_ratio(logp, behav))
    if level == "sequence":
        return jnp.broadcast_to(jnp.exp(_seq_log_ratio(logp, behav, mask)), logp.shape)
    raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")


def icepop(
    logp: Any, behav: Any, adv: Any, mask: Any = None, *, low: float = 0.5, high: float = 5.0
) -> tuple[jax.Array, Stats]:
    """IcePop: the token's weight ``w`` where ``low ≤ w ≤ high``, else 0 (still counted)."""
    _band("icepop", low, high)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "icepop")
    w = jnp.exp(_log_ratio(logp, behav))
    keep = ((w >= low) & (w <= high)).astype(jnp.float32)
    return _mean(-adv * w * keep * _score(logp), mask), _stats(keep, 1 - keep, w * keep, mask)


def mis(
    logp: Any,
    behav: Any,
    adv: Any,
    mask: Any = None,
    *,
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[jax.Array, Stats]:
    """Sequence MIS: sequence TIS, a sequence with ratio outside ``[low, high]`` dropped
    (from the loss and from the mean's count)."""
    _check_cap("mis", cap)
    _band("mis", low, high)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "mis")
    w = _weights(logp, behav, mask, "sequence")
    keep = ((w >= low) & (w <= high)).astype(jnp.float32)
    wt = jnp.minimum(w, cap)
    loss = _mean(-adv * wt * _score(logp), mask * keep)
    return loss, _stats(keep, (w > cap).astype(jnp.float32), wt * keep, mask)


def decoupled_ppo(
    logp: Any,
    prox: Any,
    behav: Any,
    adv: Any,
    mask: Any = None,
    *,
    eps: float = 0.2,
    cap: float | None = 5.0,
) -> tuple[jax.Array, Stats]:
    """Decoupled PPO: the trust region on ``prox`` (the weights at the start of the update,
    no gradient), the behaviour weight ``prox / behav`` set to 0 above ``cap`` (None: kept)."""
    check_range(eps, "eps", "decoupled_ppo", 0.0, 1.0, high_open=False)
    if cap is not None:
        _check_cap("decoupled_ppo", cap)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "decoupled_ppo")
    prox = sg(jnp.asarray(prox, jnp.float32))
    if prox.shape != logp.shape:
        raise ValueError(
            f"decoupled_ppo: proximal log-probabilities {tuple(prox.shape)} for log-probabilities "
            f"{tuple(logp.shape)}: one per response id"
        )
    u = jnp.exp(jnp.clip(logp - prox, -BOUND, BOUND))
    per, clipped = _surrogate(adv, u, 1.0 - eps, 1.0 + eps)
    w = jnp.exp(jnp.clip(prox - behav, -BOUND, BOUND))
    keep = jnp.ones_like(w) if cap is None else (w <= cap).astype(jnp.float32)
    return _mean(per * w * keep, mask), _stats(keep, clipped, w * keep, mask)


def m2po_mask(logp: Any, behav: Any, mask: Any = None, *, threshold: float = 0.04) -> jax.Array:
    """M2PO's mask ``[n, L]``: among the counted ids, the ``k`` with the largest squared
    log-ratio dropped, ``k`` the smallest for which the rest's mean is below ``threshold``
    (every id but one when none is)."""
    check_range(threshold, "threshold", "m2po", 0.0, low_open=True)
    lp = sg(jnp.asarray(logp, jnp.float32))
    m = jnp.ones(lp.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    d2 = (jnp.clip(lp - sg(jnp.asarray(behav, jnp.float32)), -BOUND, BOUND) ** 2).reshape(-1)
    valid = m.reshape(-1) > 0
    n = jnp.sum(valid)
    key = jnp.where(valid, d2, -1.0)  # the uncounted sort last
    order = jnp.argsort(-key, stable=True)
    s = jnp.where(valid[order], d2[order], 0.0)
    suffix = jnp.cumsum(s[::-1])[::-1]  # sum of ranks j.. (uncounted add 0)
    j = jnp.arange(s.shape[0])
    rest = jnp.maximum(n - j, 1)
    below = (suffix / rest < threshold) & (j < n)
    k = jnp.where(jnp.any(below), jnp.argmax(below), jnp.maximum(n - 1, 0))
    rank = jnp.empty_like(j).at[order].set(j)
    return ((rank >= k) & valid).astype(jnp.float32).reshape(m.shape)


def m2po(
    logp: Any, behav: Any, adv: Any, mask: Any = None, *, threshold: float = 0.04
) -> tuple[jax.Array, Stats]:
    """M2PO: :func:`m2po_mask`, then ``−r·A`` on the kept ids, averaged over every counted id
    (the paper's ``1 / Σ|o_i|``; the importance ratio unclipped)."""
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "m2po")
    keep = m2po_mask(logp, behav, mask, threshold=threshold)
    r = jnp.exp(jnp.clip(logp - behav, -BOUND, BOUND))
    loss = _mean(-adv * r * keep, mask)
    return loss, _stats(keep, jnp.zeros_like(r), sg(r) * keep, mask)


def m2po_clip_bounds(
    logp: Any, behav: Any, adv: Any, mask: Any = None, *, budget: float = 0.04
) -> tuple[jax.Array, jax.Array]:
    r"""The ratio bounds ``(lo, hi)`` of M2PO's adaptive clip, as the authors' code sets them.

    The *harmful* ids are the counted ones the step would push further off the behaviour
    policy: :math:`A > 0, r > 1` or :math:`A < 0, r < 1`; :math:`v = (\log r)^2` on them,
    ``h`` of them. Where ``h = 0`` or their mean :math:`M_2 = \bar v \le` ``budget``, no clip:
    ``(0, 1e5)``. Otherwise, with ``v`` ascending and :math:`S_k = \sum_{j \le k} v_j`, the
    first ``k`` with :math:`v_k (h - k - 1) + S_k \ge h \cdot \mathrm{budget}` (capping
    every ``v`` at :math:`v_k` would meet the budget) gives :math:`c^2 = v_{k-1}` (0 when
    ``k = 0``): the largest breakpoint at which the capped :math:`M_2` stays within budget,
    and the bounds :math:`(e^{-c}, e^{c})`. (The code's 1e-12 tolerances are below
    float32's resolution at these scales and left out.)"""
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "m2po_clip_bounds")
    return _m2po_bounds(logp, behav, adv, mask, budget)


def _m2po_bounds(
    logp: jax.Array, behav: jax.Array, adv: jax.Array, mask: jax.Array, budget: float
) -> tuple[jax.Array, jax.Array]:
    """:func:`m2po_clip_bounds` on inputs already through :func:`_inputs`."""
    d = _log_ratio(logp, behav)
    harm = (mask > 0) & (((adv > 0) & (d > 0)) | ((adv < 0) & (d < 0)))
    v = jnp.sort(jnp.where(harm, d * d, jnp.inf).reshape(-1))  # the h harmful ids first
    h = jnp.sum(harm)
    j = jnp.arange(v.shape[0])
    inside = j < h
    s = jnp.cumsum(jnp.where(inside, v, 0.0))
    meets = inside & (v * (h - j - 1) + s >= h * budget)
    k = jnp.argmax(meets)
    c = jnp.sqrt(jnp.where(k > 0, v[jnp.maximum(k - 1, 0)], 0.0))
    apply = (h > 0) & (s[-1] > h * budget)
    return jnp.where(apply, jnp.exp(-c), 0.0), jnp.where(apply, jnp.exp(c), 1e5)


def m2po_clip(
    logp: Any,
    behav: Any,
    adv: Any,
    mask: Any = None,
    *,
    budget: float = 0.04,
    dual_clip: float | None = None,
) -> tuple[jax.Array, Stats]:
    """M2PO as its authors' code runs it: PPO's clipped surrogate against the behaviour policy,
    the bounds from :func:`m2po_clip_bounds` (one pair per batch, no gradient), the token mean
    over the mask; no dual clip (``dual_clip`` c > 1: where ``A < 0`` at most ``−A·c``, as
    :func:`ppo_clip` does — the authors' loss leaves an id with ``A < 0`` and ``r ≫ 1``
    unbounded)."""
    if not budget > 0:
        raise ValueError(f"m2po_clip: budget must be > 0, got {budget}")
    _check_dual("m2po_clip", dual_clip)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "m2po_clip")
    lo, hi = _m2po_bounds(logp, behav, adv, mask, budget)
    return _clipped_loss(logp, behav, adv, mask, lo, hi, dual_clip)


def ess_ratio(logp: Any, behav: Any, mask: Any = None) -> jax.Array:
    r"""VCPO's ``ρ = ESS / n``: the effective sample size ``(Σ w)² / Σ w²`` of the sequences'
    importance weights ``w_i = exp(l_i)``, :math:`l_i = \sum_t \log r_{i,t}` (not truncated),
    over their number, computed on the weights shifted by the largest, :math:`w'_i =
    e^{l_i - \max_j l_j}` (ESS does not change; the largest shifted weight is 1, so no drift
    underflows or overflows it: the authors' first code summed the weights themselves and read
    ESS = 0 once all fell below float32's range, NaN once one passed it).
    1 on-policy (exactly); ``1 / n`` when one sequence carries all the weight."""
    lp, b, _, m = _inputs(logp, behav, jnp.zeros(jnp.shape(logp)[:1]), mask, "ess_ratio")
    lw = jnp.sum((sg(lp) - b) * m, axis=1)
    w = jnp.exp(lw - jnp.max(lw))
    return sg(jnp.sum(w) ** 2 / jnp.sum(w**2) / w.shape[0])


def vcpo(
    logp: Any, behav: Any, adv: Any, mask: Any = None, *, cap: float = 8.0
) -> tuple[jax.Array, Stats]:
    """VCPO's loss: sequence TIS (``cap`` 8), averaged over each sequence's ids then over the
    sequences; the step's rate comes from :func:`ess_ratio` through :func:`scale_by_ess`."""
    _check_cap("vcpo", cap)
    logp, behav, adv, mask = _inputs(logp, behav, adv, mask, "vcpo")
    w = _weights(logp, behav, mask, "sequence")
    wt = jnp.minimum(w, cap)
    per = jnp.sum(-adv * wt * _score(logp) * mask, axis=1) / jnp.maximum(jnp.sum(mask, 1), 1e-8)
    has = (jnp.sum(mask, axis=1) > 0).astype(jnp.float32)
    loss = jnp.sum(per * has) / jnp.maximum(jnp.sum(has), 1.0)
    return loss, _stats(jnp.ones_like(w), (w > cap).astype(jnp.float32), wt, mask)


class ScaleByESSState(NamedTuple):
    """Stateless: the scale is the step's extra argument."""


def scale_by_ess(rule: Literal["sqrt", "linear"] = "sqrt", base: float = 1.0) -> Any:
    """VCPO's step-size rule as an Optax transform placed after the optimizer (so that it
    scales the step, as scaling the learning rate does for Adam too): updates times
    ``sqrt(min(1, ρ / base))`` (``"linear"``: ``min(1, ρ / base)``), ``ρ`` passed to
    ``update`` as ``ess_ratio=`` (:func:`ess_ratio`; none given: 1, no scaling).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.chain(optax.sgd(1.0), scale_by_ess())
        >>> u, _ = tx.update({"w": jnp.array(2.0)}, tx.init({"w": 0.0}), ess_ratio=0.25)
        >>> float(u["w"])  # -2 · sqrt(0.25)
        -1.0
    """
    if rule not in ("sqrt", "linear"):
        raise ValueError(f"scale_by_ess: rule must be 'sqrt' or 'linear', got {rule!r}")
    if not base > 0:
        raise ValueError(f"scale_by_ess: base must be > 0, got {base}")

    def init(params: Any) -> ScaleByESSState:
        del params
        return ScaleByESSState()

    def update(
        updates: Any, state: ScaleByESSState, params: Any = None, *, ess_ratio: Any = None,
        **extra: Any,
    ) -> tuple[Any, ScaleByESSState]:  # fmt: skip
        del params, extra
        if ess_ratio is None:
            return updates, state
        s = jnp.minimum(1.0, jnp.asarray(ess_ratio, jnp.float32) / base)
        s = jnp.sqrt(s) if rule == "sqrt" else s
        return jax.tree.map(lambda u: (u * s).astype(u.dtype), updates), state

    return optax.GradientTransformationExtraArgs(init, update)


#: the corrections by name (``decoupled_ppo`` takes a proximal policy too)
CORRECTIONS = {
    "reinforce": reinforce,
    "ppo-clip": ppo_clip,
    "tis": tis,
    "tis-seq": lambda *a, **k: tis(*a, level="sequence", **k),
    "icepop": icepop,
    "mis": mis,
    "m2po": m2po,
    "m2po-clip": m2po_clip,
    "vcpo": vcpo,
}
