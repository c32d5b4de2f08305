r"""Models as ordered sequences of blocks: pipeline-stage splitting and the functional form.

A :class:`StagedModel` is an ``nnx.Module`` holding an ``nnx.List`` of blocks applied in order,

.. math::

    f(x) = (b_{L-1} \circ \dots \circ b_1 \circ b_0)(x).

:func:`split` cuts the block sequence into ``N`` contiguous pipeline stages
``f = s_{N-1} \circ \dots \circ s_0`` that share the model's Variables (no copies), and
:func:`functional` turns any module into a pure ``apply(params, state, x, train)`` function that
``jax.jit``, ``jax.grad`` and ``lax.scan`` can use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from flax import nnx

__all__ = [
    "Functional",
    "StagedModel",
    "balanced_bounds",
    "block_param_counts",
    "functional",
    "functional_stages",
    "param_count",
    "split",
]


class StagedModel(nnx.Module):
    """An ordered sequence of blocks, ``y = blocks[-1](... blocks[0](x))``.

    Each block is an ``nnx.Module`` called as ``block(x)``. Blocks with batch-norm follow the NNX
    train/eval mode: ``model.train()`` normalises with batch statistics and updates the running
    averages, ``model.eval()`` uses the running averages. NNX modules start in train mode.

    Args:
      blocks: the blocks, in application order (at least one). They are stored as given (not
        copied), so two ``StagedModel`` objects built from the same blocks share Variables.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from jaxstale.models import StagedModel
      >>> rngs = nnx.Rngs(0)
      >>> model = StagedModel([nnx.Linear(3, 4, rngs=rngs), nnx.Linear(4, 2, rngs=rngs)])
      >>> len(model.blocks), model(jnp.ones((5, 3))).shape
      (2, (5, 2))
    """

    def __init__(self, blocks: Sequence[nnx.Module]):
        blocks = list(blocks)
        if not blocks:
            raise ValueError("StagedModel needs at least one block, got an empty sequence.")
        self.blocks = nnx.List(blocks)

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


def param_count(module: nnx.Module) -> int:
    """Number of scalar parameters (``nnx.Param`` entries) in ``module``.

    Args:
      module: any NNX module.

    Returns:
      The total size of its ``nnx.Param`` leaves (batch statistics are not counted).

    Example:
      >>> from flax import nnx
      >>> from jaxstale.models import param_count
      >>> param_count(nnx.Linear(3, 4, rngs=nnx.Rngs(0)))  # 3*4 weights + 4 biases
      16
    """
    return int(sum(leaf.size for leaf in jax.tree.leaves(nnx.state(module, nnx.Param))))


def block_param_counts(model: StagedModel) -> list[int]:
    """Parameter count of every block of ``model``, in order (see :func:`param_count`)."""
    return [param_count(block) for block in model.blocks]


def balanced_bounds(weights: Sequence[int], num_stages: int) -> list[tuple[int, int]]:
    """Contiguous partition of ``weights`` into ``num_stages`` non-empty groups.

    Minimises the largest group sum; among the partitions achieving it, minimises the sum of
    squared group sums (the most even one); remaining ties go to the earliest cut. Exact dynamic
    programmes, ``O(num_stages * n^2)``.
    """
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + int(w))
    inf = float("inf")

    def seg(i: int, j: int) -> int:
        return prefix[j] - prefix[i]

    # Pass 1: best[k][j] = min over partitions of weights[:j] into k groups of the max group sum.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            best[k][j] = min(max(best[k - 1][i], seg(i, j)) for i in range(k - 1, j))
    cap = best[num_stages][n]
    # Pass 2: among partitions whose groups are all <= cap, minimise the sum of squares.
    sq = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    arg = [[-1] * (n + 1) for _ in range(num_stages + 1)]
    sq[0][0] = 0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                s = seg(i, j)
                if s <= cap and sq[k - 1][i] + s * s < sq[k][j]:
                    sq[k][j] = sq[k - 1][i] + s * s
                    arg[k][j] = i
    bounds = []
    j = n
    for k in range(num_stages, 0, -1):
        i = arg[k][j]
        bounds.append((i, j))
        j = i
    return bounds[::-1]


def split(model: nnx.Module, num_stages: int) -> list[StagedModel]:
    r"""Split a model into ``num_stages`` contiguous pipeline stages balanced by parameter count.

    With block parameter counts :math:`p_0, \dots, p_{L-1}`, the cut points
    :math:`0 = c_0 < c_1 < \dots < c_N = L` minimise the largest stage

    .. math::

        \max_{k} \sum_{l = c_k}^{c_{k+1} - 1} p_l,

    and among those the sum of squared stage sizes (exact dynamic programming; deterministic,
    ties go to the earliest cut). Every stage holds the *same* block objects as ``model`` (no
    copies), so updating the model updates the stages and
    ``stages[-1](... stages[0](x)) == model(x)`` bit for bit, in train and eval mode.

    Only a :class:`StagedModel` (an ordered sequence of blocks) can be split: any other
    ``nnx.Module`` (e.g. one from ``jaxstale.models.register_model``) trains with the synchronous
    and data-parallel code, which takes the whole model, but not in a pipeline.

    Args:
      model: the :class:`StagedModel` to split.
      num_stages: number of stages ``N``, ``1 <= N <= len(model.blocks)``.

    Returns:
      A list of ``N`` :class:`StagedModel` stages, each with at least one block.

    Raises:
      ValueError: if ``num_stages`` is not an int in ``[1, len(model.blocks)]``.
      TypeError: if ``model`` is not a :class:`StagedModel`.

    Example:
      >>> from jaxstale import models
      >>> model = models.create("resnet20", input_shape=(32, 32, 3), num_classes=10)
      >>> [len(s.blocks) for s in models.split(model, 4)]
      [7, 1, 1, 2]
      >>> [models.param_count(s) for s in models.split(model, 4)]
      [65552, 55552, 73984, 74634]
    """
    if not isinstance(model, StagedModel):
        raise TypeError(
            f"Only a StagedModel can be split into pipeline stages, got {type(model).__name__}. "
            "Any nnx.Module works with the synchronous trainer and the data-parallel emulator and "
            "executor; to pipeline a model, build it as StagedModel([block_0, block_1, ...]) "
            "(blocks applied in order)."
        )
    n = len(model.blocks)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int):
        raise ValueError(f"num_stages must be an int in [1, {n}], got {num_stages!r}.")
    if not 1 <= num_stages <= n:
        raise ValueError(
            f"num_stages must be in [1, {n}] (the model has {n} blocks), got {num_stages}."
        )
    bounds = balanced_bounds(block_param_counts(model), num_stages)
    return [StagedModel([model.blocks[b] for b in range(i, j)]) for i, j in bounds]


class Functional(NamedTuple):
    """A module in functional form (see :func:`functional`).

    Attributes:
      apply: ``apply(params, state, x, train) -> (y, new_state)``, pure and jittable
        (``train`` is a static Python bool).
      params: the module's ``nnx.Param`` variables as an ``nnx.State`` pytree.
      state: all other variables (e.g. ``nnx.BatchStat``); an empty ``nnx.State`` if none.
      graphdef: the ``nnx.GraphDef`` (static structure) used to rebuild the module.
    """

    apply: Callable[..., tuple[jax.Array, nnx.State]]
    params: nnx.State
    state: nnx.State
    graphdef: Any


def _split_params(module: nnx.Module) -> tuple[Any, nnx.State, nnx.State]:
    graphdef, params, *rest = nnx.split(module, nnx.Param, ...)
    return graphdef, params, rest[0]


def functional(module: nnx.Module) -> Functional:
    r"""Pure functional form of an NNX module: ``(y, state') = apply(params, state, x, train)``.

    ``params`` are the module's ``nnx.Param`` variables and ``state`` everything else (batch
    statistics). ``apply`` rebuilds a private copy of the module from ``(graphdef, params,
    state)``, puts it in train mode (``train=True``: batch-norm normalises with batch statistics
    and updates its running averages, :math:`\mu \leftarrow m \mu + (1 - m)\bar x_B`) or eval
    mode (``train=False``: running averages, state unchanged), runs it, and returns the output
    with the non-``Param`` state after the call. ``new_state`` has the same tree structure as
    ``state``, so it can be carried through ``lax.scan`` or donated to a jitted step. ``apply``
    never mutates its arguments or ``module``; ``jax.grad`` with respect to ``params`` works.

    Args:
      module: any NNX module, e.g. a :class:`StagedModel` or one stage from :func:`split`.

    Returns:
      A :class:`Functional` ``(apply, params, state, graphdef)`` holding the module's current
      values.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxstale import models
      >>> model = models.create("mlp", input_shape=(8, 8, 1), num_classes=10)
      >>> f = models.functional(model)
      >>> x = jnp.ones((2, 8, 8, 1))
      >>> y, new_state = f.apply(f.params, f.state, x, False)
      >>> y.shape, bool(jnp.all(y == model(x)))
      ((2, 10), True)
      >>> apply = jax.jit(f.apply, static_argnames="train")
      >>> grads = jax.grad(lambda p: apply(p, f.state, x, train=True)[0].sum())(f.params)
      >>> jax.tree.structure(grads) == jax.tree.structure(f.params)
      True
    """
    graphdef, params, state = _split_params(module)

    def apply(
        params: nnx.State, state: nnx.State, x: jax.Array, train: bool
    ) -> tuple[jax.Array, nnx.State]:
        m = nnx.merge(graphdef, params, state, copy=True)
        if train:
            m.train()
        else:
            m.eval()
        y = m(x)
        new_state = _split_params(m)[2]
        return y, new_state

    return Functional(apply=apply, params=params, state=state, graphdef=graphdef)


def functional_stages(model: nnx.Module, num_stages: int) -> list[Functional]:
    """``[functional(s) for s in split(model, num_stages)]``: each stage in functional form.

    Args:
      model: the :class:`StagedModel` to split.
      num_stages: number of pipeline stages (see :func:`split`).

    Returns:
      One :class:`Functional` per stage; stage ``k``'s ``apply`` maps stage ``k``'s input to its
      output.

    Raises:
      TypeError: ``model`` is not a :class:`StagedModel` (see :func:`split`).
      ValueError: bad ``num_stages`` (see :func:`split`).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale import models
      >>> model = models.create("cnn", input_shape=(8, 8, 1), num_classes=10)
      >>> x = jnp.ones((2, 8, 8, 1))
      >>> for f in models.functional_stages(model, 2):
      ...     x, _ = f.apply(f.params, f.state, x, False)
      >>> x.shape
      (2, 10)
    """
    return [functional(s) for s in split(model, num_stages)]
