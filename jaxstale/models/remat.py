r"""Rematerialisation: which of a stage's activations its backward keeps, which it recomputes.

A pipeline keeps every in-flight forward's residuals until its backward runs: stage ``k`` of an
asynchronous 1F1B pipeline holds ``N − k`` of them, so a residual slot's size decides the
pipeline's memory (``benchmarks/pipeline_memory_gpt.py``). ``jax.vjp`` of a GPT block keeps
about 3× what PyTorch autograd keeps: the GELU's intermediates at four times the width, the
attention's scores and probabilities and the causal mask. :func:`remat` wraps a stage's
``apply`` in :func:`jax.checkpoint` with one of :data:`REMAT`:

* ``"none"`` — the stage as it is: ``jax.vjp``'s own residuals;
* ``"names"`` — save only the activations the model tags with
  ``jax.ad_checkpoint.checkpoint_name`` (the GPT: :data:`jaxstale.models.gpt.SAVED_NAMES`, the
  residual stream, the norms' outputs, q/k/v and the MLP's pre-activation) and recompute the
  rest from them: the attention's softmax from q and k, the GELU from its input. What is
  recomputed is a function of saved *activations* and the weights as themselves, so where the
  backward's weights differ from the forward's (vanilla, prediction) they enter wherever a
  weight enters — the saved backward's rule, kept more strictly than ``"none"`` keeps it
  (``jax.vjp`` of a layer norm saves its scale's broadcast copy, the forward's);
* ``"dots"`` — ``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``: save the outputs
  of the weight products, recompute everything else (norms included) from the stage input;
* ``"full"`` — save nothing: the whole stage forward is recomputed in the backward.

Where a pass's backward reads the weights its forward read (synchronous training, ``stash``,
the loss stage) every choice gives the same gradient up to the rounding of the recomputed
values. Where they differ, ``"dots"`` and ``"full"`` recompute the non-saved activations at the
*backward's* weights — what a framework with activation recompute does, a different gradient
from the saved backward's (``"full"`` is ``backward="recompute"``'s, bit for bit).

Measured (``benchmarks/pipeline_memory_gpt.py``; gpt-cpu, N = 8, 16 × 64 tokens, AdamW, the
emulator's carried state): vanilla 446.23 MiB with ``"none"``, 104.75 ``"names"``, 85.25
``"dots"``, 15.25 ``"full"``; stash 451.82 / 110.34 / 90.84 / 20.84.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxstale import models
    >>> (stage,) = models.functional_stages(models.gpt(8, 11, layers=1, width=16, heads=2), 1)
    >>> lean = remat(stage, "names")
    >>> x = jnp.zeros((2, 8), jnp.int32)
    >>> y, _ = lean.apply(lean.params, lean.state, x, True)
    >>> bool(jnp.all(y == stage.apply(stage.params, stage.state, x, True)[0]))
    True

References:
    Chen, Xu, Zhang, Guestrin, "Training Deep Nets with Sublinear Memory Cost",
    arXiv:1604.06174, 2016. Korthikanti et al., "Reducing Activation Recomputation in Large
    Transformer Models", MLSys 2023 (selective recompute of the attention core).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxstale._compile import memo
from jaxstale.models.gpt import SAVED_NAMES
from jaxstale.models.staged import Functional

__all__ = ["REMAT", "remat", "remat_policy", "remat_stages"]

#: the rematerialisation choices of :func:`remat` (module docstring)
REMAT: tuple[str, ...] = ("none", "names", "dots", "full")


def remat_policy(name: str) -> Callable[..., bool] | None:
    """The ``jax.checkpoint`` policy of ``name`` (one of :data:`REMAT`; ``"full"``: None, save
    nothing). ``ValueError`` in one line for any other name."""
    if name not in REMAT or name == "none":
        raise ValueError(f"remat must be one of {', '.join(REMAT)}, got {name!r}")
    pols = jax.checkpoint_policies
    return {
        "names": pols.save_only_these_names(*SAVED_NAMES),
        "dots": pols.dots_with_no_batch_dims_saveable,
        "full": None,
    }[name]


def _wrapped(apply: Callable[..., Any], name: str, static: tuple[int, ...]) -> Any:
    # one wrapper per apply: the compiled rounds' memo keys on its identity
    build = lambda: jax.checkpoint(apply, policy=remat_policy(name), static_argnums=static)
    return memo("remat", (id(apply), name), build, keep=apply)


def remat(stage: Any, name: str) -> Any:
    """``stage`` (a :class:`~jaxstale.models.Functional` or an ``(fn(params, x), params)``
    pair) with its forward under the rematerialisation ``name`` (:data:`REMAT`); the same
    object for ``"none"``, the same wrapper for the same stage and name (so runs that share
    stages share compiled programs)."""
    if name == "none":
        return stage
    if isinstance(stage, Functional):
        return stage._replace(apply=_wrapped(stage.apply, name, (3,)))
    if isinstance(stage, tuple | list) and len(stage) == 2 and callable(stage[0]):
        return (_wrapped(stage[0], name, ()), stage[1])
    raise TypeError(
        "remat takes a jaxstale.models.Functional or a (fn(params, x) -> y, params) pair, "
        f"got {type(stage).__name__}"
    )


def remat_stages(stages: Sequence[Any], name: str) -> list[Any]:
    """:func:`remat` of every stage (the loss stage too: its forward and backward are fused,
    so it keeps nothing across ticks, but a stage is treated alike wherever it sits)."""
    if name != "none":
        remat_policy(name)  # an unknown name: one line before any stage is wrapped
    return [remat(st, name) for st in stages]
