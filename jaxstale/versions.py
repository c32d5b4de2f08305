"""An explicit weight-version buffer: the last ``capacity`` versions of a pytree, stacked.

``VersionBuffer`` is the one place in jaxstale where "the weights as they were τ updates ago"
live. Every leaf of the tracked pytree is stored as one array of shape
``[capacity, *leaf.shape]`` (a ring buffer over the leading axis) plus an ``int32`` ``head``
pointing at the most recent version. Everything is a plain pytree of arrays, so a buffer can be a
``jax.jit`` argument (donate it: then ``push`` writes in place), a ``lax.scan`` carry or a
``jax.vmap`` operand, and the stacked leaves keep the sharding of the tracked leaves on their
trailing dimensions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstale._checks import check_int, debug_check

__all__ = ["VersionBuffer"]

PyTree = Any

_INT32_MAX = np.iinfo(np.int32).max


def _concrete_int(x: Any) -> int | None:
    """``int(x)`` if ``x`` is a concrete integer scalar, ``None`` if it is traced."""
    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, bool):
        raise TypeError(f"VersionBuffer.get: tau must be an integer, got the bool {x!r}")
    arr = np.asarray(x)
    if arr.shape != ():
        raise ValueError(
            f"VersionBuffer.get: tau must be a scalar integer, got an array of shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"VersionBuffer.get: tau must be an integer, got {arr.dtype} value {x!r}")
    return int(arr)


def conform_structure(tree: PyTree, reference: PyTree) -> PyTree | None:
    """``tree`` rebuilt with ``reference``'s structure, or ``None`` if they differ for real.

    Pytrees that differ only by ``flax.nnx`` ``Variable`` wrappers (an ``nnx.State`` of
    ``Param`` variables vs. the same state of plain arrays, as ``nnx.as_pure`` gives) are the
    same weights: their leaves are rebuilt into ``reference``'s structure.
    """
    want, got = jax.tree.structure(reference), jax.tree.structure(tree)
    if want == got:
        return tree
    if jax.tree.structure(nnx.as_pure(reference)) == jax.tree.structure(nnx.as_pure(tree)):
        return jax.tree.unflatten(want, jax.tree.leaves(tree))
    return None


def _stack_leaf(leaf: Any, capacity: int) -> jax.Array:
    """``capacity`` copies of ``leaf`` stacked on a new leading axis, keeping its sharding."""
    leaf = jnp.asarray(leaf)
    stacked = jnp.broadcast_to(leaf[None], (capacity, *leaf.shape))
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, jax.core.Tracer) or not isinstance(sharding, jax.sharding.NamedSharding):
        return jnp.array(stacked)  # a real copy: the buffer must own its memory (donation)
    spec = jax.sharding.PartitionSpec(None, *sharding.spec)
    return jax.device_put(stacked, jax.sharding.NamedSharding(sharding.mesh, spec))


@dataclasses.dataclass(frozen=True)
class VersionBuffer:
    """The last ``capacity`` versions of a pytree as stacked arrays with an ``int32`` head.

    Version bookkeeping: ``create(w_0, K)`` fills all ``K`` slots with ``w_0``; each ``push(w_t)``
    writes the new version into the next slot of a ring and moves ``head`` there. ``get(τ)``
    returns the version pushed ``τ`` pushes ago, ``τ = 0`` being the most recent one:

    .. math::

        \\mathrm{get}(\\tau) = w_{t-\\tau}, \\qquad 0 \\le \\tau < K,

    where ``t`` is the number of pushes so far (``count``). **Before ``K`` pushes** a τ larger
    than ``t`` returns the initial tree ``w_0`` given to ``create`` (the slots not yet
    overwritten hold it): ``get(τ) = w_{max(t-τ, 0)}``, which is what a delay emulator wants at
    the start of training (no weights older than ``w_0`` exist).

    Staleness semantics: a gradient taken at ``get(τ)`` and applied after the ``t``-th update is
    τ-stale; ``get(0)`` is the current weights (no staleness).

    Errors: ``capacity < 1``, a concrete ``τ ≥ capacity`` or ``τ < 0``, and pushing a pytree of
    another structure, shape or dtype raise ``ValueError``. A *traced* τ (inside ``jax.jit``,
    ``lax.scan`` or ``jax.vmap``) cannot be checked on the host: after
    :func:`jaxstale.enable_traced_checks` ``get`` registers a ``checkify`` check (wrap the
    computation in ``jax.experimental.checkify.checkify`` to have an out-of-range τ reported);
    otherwise the index is clamped to ``[0, capacity - 1]`` (never a silent wrap-around to a
    newer version). The checks are off by default: an effectful check slows every jitted call.

    Performance: pass the buffer as a donated argument of a jitted step
    (``jax.jit(step, donate_argnums=...)``); ``push`` then updates one slot in place. Without
    donation XLA copies all ``capacity`` versions every step.

    Attributes:
      versions: the tracked pytree with every leaf stacked to ``[capacity, *leaf.shape]``.
      head: ``int32`` scalar, the slot of the most recent version.
      count: ``int32`` scalar, the number of pushes since ``create`` (saturating at 2**31 - 1).
      capacity: the number of versions kept (static: part of the pytree structure).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale import VersionBuffer
      >>> buf = VersionBuffer.create({"w": jnp.zeros(2)}, capacity=3)
      >>> for t in range(1, 5):
      ...     buf = buf.push({"w": jnp.full(2, float(t))})
      >>> [float(buf.get(tau)["w"][0]) for tau in range(3)]
      [4.0, 3.0, 2.0]
      >>> int(buf.count), buf.capacity
      (4, 3)
    """

    versions: PyTree
    head: jax.Array
    count: jax.Array
    capacity: int = dataclasses.field(metadata={"static": True})

    @classmethod
    def create(cls, tree: PyTree, capacity: int) -> VersionBuffer:
        """A buffer of ``capacity`` versions, every slot holding ``tree`` (version 0).

        Args:
          tree: a pytree of arrays (e.g. model parameters); it is copied.
          capacity: the number of versions kept, ``≥ 1``; the largest readable staleness is
            ``capacity - 1``.

        Returns:
          A ``VersionBuffer`` with ``head = 0`` and ``count = 0``.

        Raises:
          TypeError: ``capacity`` is not an int (a bool, a float, a traced value).
          ValueError: ``capacity < 1``.
        """
        capacity = check_int(capacity, "capacity", "VersionBuffer.create", 1)
        versions = jax.tree.map(lambda leaf: _stack_leaf(leaf, capacity), tree)
        # head and count must be distinct buffers: both may be donated in the same call
        head, count = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
        return cls(versions=versions, head=head, count=count, capacity=capacity)

    def _conform(self, tree: PyTree) -> PyTree:
        """``tree`` in the buffer's structure; ``ValueError`` unless it has the same leaves."""
        conformed = conform_structure(tree, self.versions)
        if conformed is None:
            raise ValueError(
                "VersionBuffer.push: the pytree structure differs from the one the buffer was "
                f"created with.\n  expected: {jax.tree.structure(self.versions)}\n"
                f"  got:      {jax.tree.structure(tree)}"
            )
        tree = conformed
        paths_and_stacks = jax.tree_util.tree_leaves_with_path(self.versions)
        for (path, stack), leaf in zip(paths_and_stacks, jax.tree.leaves(tree), strict=True):
            shape, dtype = tuple(jnp.shape(leaf)), jnp.result_type(leaf)
            if shape != stack.shape[1:] or dtype != stack.dtype:
                name = jax.tree_util.keystr(path)
                raise ValueError(
                    f"VersionBuffer.push: leaf {name} has shape {shape} and dtype {dtype}; the "
                    f"buffer holds shape {stack.shape[1:]} and dtype {stack.dtype}"
                )
        return tree

    def push(self, tree: PyTree) -> VersionBuffer:
        """Store ``tree`` as the newest version (it becomes ``get(0)``), dropping the oldest.

        Args:
          tree: a pytree with exactly the structure, leaf shapes and dtypes given to ``create``
            (``flax.nnx`` ``Variable`` wrappers may differ: an ``nnx.State`` of ``Param``
            variables and the same state of plain arrays are the same weights).

        Returns:
          The new buffer (functional update; in place when the buffer is a donated argument).
        """
        tree = self._conform(tree)
        head = (self.head + 1) % self.capacity
        versions = jax.tree.map(
            lambda stack, leaf: jax.lax.dynamic_update_index_in_dim(stack, leaf, head, 0),
            self.versions,
            tree,
        )
        count = jnp.where(self.count < _INT32_MAX, self.count + 1, self.count)
        return VersionBuffer(versions=versions, head=head, count=count, capacity=self.capacity)

    def get(self, tau: jax.typing.ArrayLike = 0) -> PyTree:
        """The version pushed ``tau`` pushes ago (``tau = 0``: the most recent).

        Args:
          tau: an integer in ``[0, capacity)``, a Python int or a (possibly traced) int array
            scalar. A concrete out-of-range value raises ``ValueError``; a traced one is
            checked by ``checkify`` (after :func:`jaxstale.enable_traced_checks`) when the caller
            wraps the computation in ``checkify.checkify``, and is otherwise clamped into range.

        Returns:
          A pytree with the structure given to ``create``.

        Example:
          A traced τ out of range is reported when the computation runs under ``checkify``
          (with traced checks enabled):

          >>> import jax, jax.numpy as jnp
          >>> from jax.experimental import checkify
          >>> from jaxstale import VersionBuffer, enable_traced_checks
          >>> before = enable_traced_checks()
          >>> buf = VersionBuffer.create({"w": jnp.zeros(2)}, capacity=3)
          >>> checked = jax.jit(checkify.checkify(lambda b, tau: b.get(tau)))
          >>> err, _ = checked(buf, jnp.int32(5))
          >>> print(err.get())
          VersionBuffer.get: tau=5 is outside [0, 3) (`check` failed)
          >>> err, _ = checked(buf, jnp.int32(2))
          >>> print(err.get())
          None
          >>> _ = enable_traced_checks(before)
        """
        concrete = _concrete_int(tau)
        if concrete is not None:
            if not 0 <= concrete < self.capacity:
                raise ValueError(
                    f"VersionBuffer.get: tau must be in [0, {self.capacity}) for a buffer of "
                    f"capacity {self.capacity}, got {concrete}"
                )
            tau = jnp.asarray(concrete, jnp.int32)
        else:
            tau = jnp.asarray(tau)
            if tau.shape != () or not jnp.issubdtype(tau.dtype, jnp.integer):
                raise TypeError(
                    f"VersionBuffer.get: tau must be an integer scalar, got shape {tau.shape} "
                    f"and dtype {tau.dtype}"
                )
            debug_check(
                (tau >= 0) & (tau < self.capacity),
                "VersionBuffer.get: tau={tau} is outside [0, {capacity})",
                tau=tau,
                capacity=jnp.asarray(self.capacity),
            )
            tau = jnp.clip(tau, 0, self.capacity - 1).astype(jnp.int32)
        index = (self.head - tau) % self.capacity
        return jax.tree.map(
            lambda stack: jax.lax.dynamic_index_in_dim(stack, index, 0, keepdims=False),
            self.versions,
        )

    def latest(self) -> PyTree:
        """The most recent version, ``get(0)``."""
        return self.get(0)


jax.tree_util.register_dataclass(
    VersionBuffer, data_fields=["versions", "head", "count"], meta_fields=["capacity"]
)
