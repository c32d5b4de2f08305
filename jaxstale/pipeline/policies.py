"""Pipeline weight policies as data: which weight version each forward and backward pass uses.

:data:`POLICIES` is the only place a policy is defined; :func:`register_policy` adds yours. The
compiler (:func:`jaxstale.pipeline.program.compile`) turns a schedule and a policy into per-pass
tables (stash look-back ``τ``, prediction horizon ``s`` and rule) that both executors run, so a
policy combining these mechanisms is one row, everywhere. With ``W_k`` the stage's weights at
the pass's tick and ``s`` = target version − current version (memory per stage in brackets):

* ``sync`` — GPipe with a flush: every pass at the target, no staleness. [1 weight copy]
* ``vanilla`` — both passes at ``W_k`` as it is at their tick: stale and inconsistent. [1 copy]
* ``stash`` — PipeDream: the backward reloads its forward's version. [``N − k`` on 1F1B]
* ``spectrain-v1`` — both passes at ``W_k + s·Δw_last`` towards the SpecTrain lab's round-trip
  target. [1 copy + ``Δw_last``]
* ``spectrain-v2`` — the forward predicted towards the sequential target, the backward at
  ``W_k`` (the lab stashes its forward prediction for the backward; on asynchronous 1F1B the
  backward's current version *is* the sequential target). [1 copy + ``Δw_last``]
* ``nesterov`` — as v1 with NAG's decaying extrapolation ``W_k + Δw_last·(μ + … + μ^s)``.

``Δw_last`` is the stage optimizer's last update (:func:`jaxstale.weight_prediction`: SpecTrain's
``−sηv`` for SGD-momentum, XPipe's for Adam).

Example:
    >>> from jaxstale.pipeline import POLICIES
    >>> POLICIES["stash"].stash, POLICIES["spectrain-v1"].target
    (True, 'roundtrip')

References:
    Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019.
    Chen, Yang, Cheng, "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform" (SpecTrain), arXiv:1809.02839, 2018.
"""

from __future__ import annotations

from typing import NamedTuple

from jaxstale.schedules import TARGETS

__all__ = ["POLICIES", "PREDICTORS", "Policy", "get_policy", "register_policy"]

PREDICTORS: tuple[str, ...] = ("spectrain", "nesterov")


class Policy(NamedTuple):
    """Which weight version each pass of a pipeline uses.

    Attributes:
        name: the policy's name (the ``"method"`` field of the experiment's rows).
        target: prediction target, ``"sequential"`` (version ``b`` for mini-batch ``b``) or
            ``"roundtrip"`` (the SpecTrain lab's; :mod:`jaxstale.schedules`).
        flush: run the schedule's flush counterpart (GPipe) when it has staleness.
        stash: the backward uses the version its forward used (weight stashing).
        predict: ``None``, ``"spectrain"`` (``W + s·Δw_last``) or ``"nesterov"``.
        predict_backward: with ``predict``, also predict in the backward pass.
    """

    name: str
    target: str = "sequential"
    flush: bool = False
    stash: bool = False
    predict: str | None = None
    predict_backward: bool = True


#: name -> Policy: the built-in policies; :func:`register_policy` adds yours.
POLICIES: dict[str, Policy] = {
    "sync": Policy("sync", flush=True),
    "vanilla": Policy("vanilla"),
    "stash": Policy("stash", stash=True),
    "spectrain-v1": Policy("spectrain-v1", target="roundtrip", predict="spectrain"),
    "spectrain-v2": Policy("spectrain-v2", predict="spectrain", predict_backward=False),
    "nesterov": Policy("nesterov", target="roundtrip", predict="nesterov"),
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
    return policy


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
