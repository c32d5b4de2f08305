"""Pipeline weight policies as data: which weight version each forward and backward pass uses.

:data:`POLICIES` is the only place a policy is defined; :func:`register_policy` adds yours. The
compiler (:func:`jaxstale.pipeline.program.compile`) turns a schedule and a policy into per-pass
tables (stash look-back ``τ``, prediction horizon ``s`` and rule, learning-rate scale) that both
executors run, so a policy combining these mechanisms is one row, everywhere. With ``W_k`` the
weights the schedule gives the pass (the stage's current ones; on ``2bw`` the older of its two
buffered versions) and ``s`` = target version − that version (memory per stage in brackets):

* ``sync`` — GPipe with a flush: every pass at the target, no staleness. [1 weight copy]
* ``vanilla`` — both passes at ``W_k``: stale and inconsistent. [1 copy]
* ``stash`` — PipeDream: the backward reloads its forward's version. [``N − k`` on 1F1B]
* ``spectrain-v1`` — both passes at ``W_k + s·Δw_last`` towards the SpecTrain lab's round-trip
  target. [1 copy + ``Δw_last``]
* ``spectrain-v2`` — the forward predicted towards the sequential target, the backward at
  ``W_k`` (the lab stashes its forward prediction for the backward; on asynchronous 1F1B the
  backward's current version *is* the sequential target). [1 copy + ``Δw_last``]
* ``nesterov`` — as v1 with NAG's decaying extrapolation ``W_k + Δw_last·(μ + … + μ^s)``.
* ``2bw`` — PipeDream-2BW: runs the :func:`~jaxstale.schedules.pipedream_2bw` schedule (the
  given schedule's ``N`` and mini-batches; its ``M`` if at least ``max(N − 1, 2)``, else
  ``N``), every pass of mini-batch ``b`` at version ``max(b − 1, 0)``. [2 copies]
* ``pipemare`` — PipeMare: learning-rate rescheduling and the backward's discrepancy
  correction ``W_k − s_B·δ``. [1 copy + ``Δw_last`` + ``δ``]
* ``pipemare-lr`` — PipeMare's learning-rate rescheduling alone, passes as ``vanilla``. [1 copy]
* ``asyncpp`` — AsyncPP's released configuration: PipeDream stashing; the method's Nesterov
  part is the optimizer (NAdamW with ``β1 = 0.99``). [as ``stash``]
* ``pipedream-lr`` — stashing plus the learning-rate rescheduling (AsyncPP's
  ``--lr_correction``). [as ``stash``]
* ``2bw-spectrain`` — PipeDream-2BW's schedule with SpecTrain's prediction: both passes of
  mini-batch ``b`` at version ``b − 1`` extrapolated one update along *that version's* last
  update, ``W_{b−1} + (W_{b−1} − W_{b−2})`` (:func:`~jaxstale.pipeline.kernel.lookback_weights`:
  the newest update is not known when the version is read); the 2BW row the constant-delay
  harness's ``predicted`` at ``τ = 1`` corresponds to. [3 copies]
* ``2bw-ef`` — PipeDream-2BW with error feedback around the stage optimizer
  (:func:`jaxstale.error_feedback`, ``c = 1``): Zmushko et al. 2026's configuration. [2 copies +
  the last update]

``Δw_last`` is the stage optimizer's last update (:func:`jaxstale.weight_prediction`: SpecTrain's
``−sηv`` for SGD-momentum, XPipe's for Adam).

**PipeDream-2BW** (Narayanan et al. 2021). The schedule is the method: 1F1B without a flush
between mini-batches, ``M`` micro-batch gradients averaged into one update per mini-batch, both
passes at ``max(b − 1, 0)``, hence ``W_{t+1} = W_t − ν·∇f(W_{t−1})`` at every stage with the
optimizer unchanged. All of it is confirmed from the official code (the ``pipedream_2bw``
branch of msr-fiddle/pipedream: ``forward_backward_pipelining_no_flushes`` and the optimizer's
two fp32 buffers, ``swap_to_older_version`` / ``swap_to_newer_version``); the row is ``stash``
on that schedule (the backward reads its forward's version from a stash of 2). Its delay-free
counterpart is PipeDream-Flush (``pipedream_2bw(..., delay=0)`` is the 1F1B-flush timeline).

**PipeMare** (Yang et al. 2021), two parts, both per stage and without a stash:

* *learning-rate rescheduling* (``lr_anneal``): the update of mini-batch ``t`` (0-based) at
  stage ``k`` is scaled by :func:`pipemare_lr_scale`, ``η_k(t)/η(t) = τ_k^{−p(t)}`` with
  ``p(t) = 1 − min((t + 1)/T, 1)`` (annealed linearly from 1 to 0 over ``T`` updates) and
  ``τ_k`` the forward's staleness ``b − fwd_version`` from the version table (``N − 1 − k`` in
  the steady state of asynchronous 1F1B; the factor is 1 where ``τ = 0``). The form, the
  per-stage scalar, the linear anneal and ``τ_k = N − 1 − k`` are confirmed only from a third
  party's code labelled "PipeMare type LR correction" (PluralisResearch/AsyncPP,
  ``main_with_runtime.py::adjust_learning_rate``, with ``T`` = 7 of its 50 epochs, hence the
  default ``lr_anneal = 0.14``); PipeMare's own ``T`` and ``τ`` for micro-batched schedules are
  not confirmed. Taking ``τ`` per update from the table (smaller during the warm-up) rather
  than the constant ``N − 1 − k`` is our reading. The factor is program data (``lr_scale``,
  computed on the host from the version table), passed to the stage optimizer as an extra
  argument and applied to its update before a predictor records it: one optimizer object
  serves every stage in both executors (the mesh runs one compiled tick on every device), so
  a per-stage optax schedule would need the stage and its ``τ`` inside the optimizer; as a
  table the executors read one more field and runs differing in ``T`` share compiled code.
* *discrepancy correction* (``predict="pipemare"``, **our reading**, no public code found):
  the forward runs at ``W_k``; the backward, which on a schedule without stashing runs ``s_B =
  bwd_version − fwd_version`` updates after its forward, runs at ``W_k − s_B·δ`` with ``δ`` an
  exponential moving average of the stage's applied updates,
  ``δ ← γ·δ + (1 − γ)·Δw``, ``δ_0 = 0`` (``γ`` = ``decay``): the weights are moved back towards
  the version the forward used. Only the idea ("older weights ≈ newer weights − elapsed time ×
  a velocity estimated from recent weight changes") is confirmed, from a secondary
  description; the recurrence, ``γ`` and the distance are ours. ``s_B = 0`` is the identity.

**AsyncPP** (Ajanthan et al. 2025, "Nesterov Method for Asynchronous Pipeline Parallel
Optimization"). Confirmed from the official code (PluralisResearch/AsyncPP:
``optim/nadamw.py``, ``optim/optimizer.py``, ``run.bash``): PipeDream's asynchronous 1F1B with
weight stashing (``N − k`` versions at stage ``k``) around ``torch.optim.NAdam`` with
``β1 = 0.99``, ``β2 = 0.999``, ``momentum_decay = 0.004`` and decoupled weight decay 0.01. The
row is therefore ``stash``; run it with ``optax.nadamw(η, b1=0.99, b2=0.999,
weight_decay=0.01)``. That is not PyTorch's NAdam: optax keeps ``μ_t = β1`` (PyTorch's
``μ_t = β1·(1 − ½·0.96^{t·ψ})`` in the limit ``ψ → ∞``) and bias-corrects with ``1 − β1^t``
instead of ``1 − Π μ_i``; with ``ψ = 0.004`` PyTorch's ``μ_t`` is ≈ 0.50 at the start and
reaches ≈ 0.89 after 10k steps. The paper's own equation for its modified look-ahead was not
reachable. The code's ``--lr_correction`` option (off in ``run.bash``) adds the PipeMare-type
rescheduling above: the ``pipedream-lr`` row. Its ``--adaptive_momentum`` (a stage-dependent
``β1``, also off) is not provided.

Example:
    >>> from jaxstale.pipeline import POLICIES
    >>> POLICIES["stash"].stash, POLICIES["spectrain-v1"].target
    (True, 'roundtrip')
    >>> POLICIES["2bw"].schedule, POLICIES["pipemare"].predict, POLICIES["pipemare"].lr_anneal
    ('2bw', 'pipemare', 0.14)

References:
    Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019.
    Chen, Yang, Cheng, "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform" (SpecTrain), arXiv:1809.02839, 2018.
    Narayanan, Phanishayee, Shi, Chen, Zaharia, "Memory-Efficient Pipeline-Parallel DNN
    Training" (PipeDream-2BW), ICML 2021, arXiv:2006.09503.
    Yang, Zhang, Li, Ré, Aberger, De Sa, "PipeMare: Asynchronous Pipeline Parallel DNN
    Training", MLSys 2021, arXiv:1910.05124.
    Ajanthan, Ramasinghe, Zuo, Avraham, Long, "Nesterov Method for Asynchronous Pipeline
    Parallel Optimization", ICML 2025, arXiv:2505.01099; code:
    https://github.com/PluralisResearch/AsyncPP.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxstale._checks import check_name
from jaxstale.schedules import SCHEDULES, TARGETS

__all__ = [
    "POLICIES",
    "PREDICTORS",
    "Policy",
    "get_policy",
    "pipemare_lr_scale",
    "register_policy",
]

PREDICTORS: tuple[str, ...] = ("spectrain", "nesterov", "pipemare")

#: ``lr_anneal`` of the built-in rows: AsyncPP's "PipeMare type" warm-up, 7 of its 50 epochs.
LR_ANNEAL = 0.14


class Policy(NamedTuple):
    """Which weight version each pass of a pipeline uses.

    Attributes:
        name: the policy's name (the ``"method"`` field of the experiment's rows).
        target: prediction target, ``"sequential"`` (version ``b`` for mini-batch ``b``) or
            ``"roundtrip"`` (the SpecTrain lab's; :mod:`jaxstale.schedules`).
        flush: run the schedule's flush counterpart (GPipe) when it has staleness.
        stash: the backward uses the version its forward used (weight stashing).
        predict: ``None``, ``"spectrain"`` (``W + s·Δw_last``), ``"nesterov"`` or
            ``"pipemare"`` (the backward at ``W − s_B·δ``; module docstring).
        predict_backward: with ``predict``, also predict in the backward pass.
        schedule: run this schedule kind (one of :data:`jaxstale.schedules.SCHEDULES`) in
            place of the given one, with its ``N`` and mini-batches (``M``: the given one's if
            at least ``max(N − 1, 2)``, else ``N``); ``None``: the given schedule.
        lr_anneal: PipeMare's learning-rate rescheduling over the first ``T`` updates, ``T`` as
            a fraction of the run's mini-batches (``T = max(1, round(lr_anneal·B))``);
            ``None``: off.
        decay: ``γ`` of the ``"pipemare"`` predictor's velocity average ``δ``, in ``[0, 1)``.
        feedback: ``c ≥ 0`` of error feedback (:func:`jaxstale.error_feedback`) around the
            stage optimizer; 0: none.
    """

    name: str
    target: str = "sequential"
    flush: bool = False
    stash: bool = False
    predict: str | None = None
    predict_backward: bool = True
    schedule: str | None = None
    lr_anneal: float | None = None
    decay: float = 0.9
    feedback: float = 0.0


#: name -> Policy: the built-in policies; :func:`register_policy` adds yours.
POLICIES: dict[str, Policy] = {
    "sync": Policy("sync", flush=True),
    "vanilla": Policy("vanilla"),
    "stash": Policy("stash", stash=True),
    "spectrain-v1": Policy("spectrain-v1", target="roundtrip", predict="spectrain"),
    "spectrain-v2": Policy("spectrain-v2", predict="spectrain", predict_backward=False),
    "nesterov": Policy("nesterov", target="roundtrip", predict="nesterov"),
    "2bw": Policy("2bw", stash=True, schedule="2bw"),
    "pipemare": Policy("pipemare", predict="pipemare", lr_anneal=LR_ANNEAL),
    "pipemare-lr": Policy("pipemare-lr", lr_anneal=LR_ANNEAL),
    "asyncpp": Policy("asyncpp", stash=True),
    "pipedream-lr": Policy("pipedream-lr", stash=True, lr_anneal=LR_ANNEAL),
    "2bw-spectrain": Policy("2bw-spectrain", predict="spectrain", schedule="2bw"),
    "2bw-ef": Policy("2bw-ef", stash=True, schedule="2bw", feedback=1.0),
}
_BUILTIN = frozenset(POLICIES)
_ALIASES = {"spectrain": "spectrain-v1"}


def _check(policy: Policy) -> Policy:
    if not isinstance(policy, Policy):
        raise TypeError(f"expected a jaxstale.pipeline.Policy, got {type(policy).__name__}")
    if not isinstance(policy.name, str) or not policy.name:
        raise ValueError(f"policy name must be a non-empty str, got {policy.name!r}")
    if policy.target not in TARGETS:
        raise ValueError(f"policy {policy.name!r}: target must be one of {TARGETS}")
    if policy.predict is not None and policy.predict not in PREDICTORS:
        raise ValueError(f"policy {policy.name!r}: predict must be None or one of {PREDICTORS}")
    if policy.stash and policy.predict is not None:
        raise ValueError(f"policy {policy.name!r}: stash and predict cannot be combined")
    if policy.schedule is not None and policy.schedule not in SCHEDULES:
        raise ValueError(f"policy {policy.name!r}: schedule must be None or one of {SCHEDULES}")
    if policy.schedule is not None and policy.flush:
        raise ValueError(f"policy {policy.name!r}: flush and schedule cannot be combined")
    a = policy.lr_anneal
    if a is not None and (isinstance(a, bool) or not isinstance(a, int | float) or not a > 0):
        raise ValueError(f"policy {policy.name!r}: lr_anneal must be None or a number > 0")
    d = policy.decay
    if isinstance(d, bool) or not isinstance(d, int | float) or not 0 <= d < 1:
        raise ValueError(f"policy {policy.name!r}: decay must be in [0, 1), got {d!r}")
    f = policy.feedback
    if isinstance(f, bool) or not isinstance(f, int | float) or not f >= 0:
        raise ValueError(f"policy {policy.name!r}: feedback must be a number >= 0, got {f!r}")
    if policy.predict == "pipemare" and policy.schedule is not None:
        raise ValueError(
            f"policy {policy.name!r}: the pipemare predictor reads the current version; it "
            "cannot run on a schedule whose passes read older ones"
        )
    return policy


def pipemare_lr_scale(staleness: np.ndarray, step: np.ndarray, warmup: int) -> np.ndarray:
    """PipeMare's learning-rate rescheduling factor ``τ^{−p(t)}``, ``p(t) = 1 − min((t+1)/T, 1)``.

    The learning rate of update ``t`` (0-based) of a stage whose gradient is ``τ`` updates
    stale is ``η(t)·τ^{−p(t)}``: ``η/τ`` at first, annealed linearly to ``η`` over ``warmup = T``
    updates, and ``η`` wherever ``τ = 0`` (module docstring: the form is confirmed from
    AsyncPP's "PipeMare type LR correction", not from PipeMare's paper).

    Args:
        staleness: ``τ ≥ 0`` per update (any shape, broadcast with ``step``).
        step: the update index ``t ≥ 0``.
        warmup: ``T ≥ 1`` updates.

    Returns:
        The factors, float32.

    Example:
        >>> from jaxstale.pipeline import pipemare_lr_scale
        >>> pipemare_lr_scale(np.array([4, 4, 4, 0]), np.array([0, 1, 3, 0]), 4).tolist()
        [0.354, 0.5, 1.0, 1.0]
    """
    tau = np.asarray(staleness, np.float64)
    p = 1.0 - np.minimum((np.asarray(step, np.float64) + 1.0) / warmup, 1.0)
    return np.where(tau >= 1, np.maximum(tau, 1.0) ** -p, 1.0).astype(np.float32)


def register_policy(policy: Policy, *, overwrite: bool = False) -> None:
    """Register ``policy`` (keyed by its name) for both pipeline executors and the experiment;
    ``ValueError`` for invalid fields or a taken name (built-ins cannot be replaced).

    Example:
        >>> from jaxstale import Policy, register_policy, pipeline, schedules
        >>> register_policy(Policy("spectrain-seq", predict="spectrain"), overwrite=True)
        >>> pipeline.compile(schedules.one_f_one_b(2, 4), "spectrain-seq").policy.target
        'sequential'
    """
    _check(policy)
    check_name(policy.name, "register_policy", "policy name")
    if policy.name in _BUILTIN or policy.name in _ALIASES:
        raise ValueError(f"policy {policy.name!r} is built in and cannot be replaced")
    if policy.name in POLICIES and not overwrite:
        raise ValueError(f"policy {policy.name!r} is already registered (pass overwrite=True)")
    POLICIES[policy.name] = policy


def get_policy(policy: str | Policy) -> Policy:
    """The :class:`Policy` of a registered name (``"spectrain"`` means ``"spectrain-v1"``), or a
    ``Policy`` checked; ``ValueError`` listing the registered names for an unknown one."""
    if isinstance(policy, Policy):
        return _check(policy)
    name = _ALIASES.get(policy, policy)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {tuple(POLICIES)}")
    return POLICIES[name]
