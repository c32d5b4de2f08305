"""Seeded batching for ``lax.scan``: :func:`batch_indices`, :func:`batches` and
:class:`Indexed` (re-exported by :mod:`jaxstale.data`, where they are documented with the
datasets)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Indexed",
    "batch_indices",
    "batches",
    "check_pairs",
    "check_streams",
    "indexed",
    "materialised",
    "stream_shape",
]


class Indexed(NamedTuple):
    """Mini-batches as indices into one copy of the data: mini-batch ``b`` is ``x[idx[b]]``.

    The pipeline and local-SGD executors take it wherever they take pre-batched ``xb`` /
    ``yb`` (``[nb, B, ...]``): the emulators keep ``x`` once on the device and gather each
    (micro-)batch inside the jitted step (bit-identical to the pre-batched copy), so a long run
    costs ``idx`` (``nb * B`` integers) instead of ``nb * B`` examples; with ``lanes = L`` only
    ``idx`` carries the lane axis (``[L, nb, B]``) and every lane shares ``x``. The mesh
    executors materialise it (:meth:`gathered`).

    Example:
      >>> import numpy as np
      >>> from jaxstale.data import Indexed, batch_indices
      >>> x = np.arange(10, dtype=np.float32).reshape(5, 2)
      >>> xb = Indexed(x, batch_indices(5, batch_size=2, num_steps=3, seed=0))
      >>> xb.shape, xb.gathered()[0].tolist()
      ((3, 2, 2), [[4.0, 5.0], [8.0, 9.0]])
    """

    x: Any
    """``[N, ...]`` examples (or labels), shared by every lane."""
    idx: Any
    """``[nb, B]`` (or ``[L, nb, B]``) integer indices into ``x``."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the pre-batched copy, ``idx.shape + x.shape[1:]``."""
        return tuple(np.shape(self.idx)) + tuple(np.shape(self.x)[1:])

    def compact(self) -> Indexed:
        """The same mini-batches over a copy of only the rows ``idx`` uses (``x[unique(idx)]``,
        ``idx`` renumbered): a lazily read ``x`` (:class:`jaxstale.tokens.Windows`) is read
        for those rows alone, and the executors hold the run's rows, not the whole file."""
        idx = np.asarray(self.idx)
        rows, inverse = np.unique(idx, return_inverse=True)
        return Indexed(np.asarray(self.x[rows]), inverse.reshape(idx.shape))

    def gathered(self) -> np.ndarray:
        """The pre-batched copy ``x[idx]`` (NumPy)."""
        return np.asarray(self.x)[np.asarray(self.idx)]

    def check(self, name: str) -> None:
        """Raises ``ValueError`` (one line, naming ``name``) unless ``idx`` holds integers in
        ``[0, len(x))`` — NumPy would wrap a negative index and a jitted gather fill an
        out-of-range one, silently."""
        idx, rows = np.asarray(self.idx), len(self.x)
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"{name}.idx must hold integer indices, got {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= rows):
            raise ValueError(
                f"{name}.idx must index its {rows} rows: found {idx.min()}..{idx.max()}"
            )


def stream_shape(a: Any) -> tuple[int, ...]:
    """The shape of a mini-batch stream: an array's, or an :class:`Indexed` one's pre-batched
    copy (:attr:`Indexed.shape`)."""
    return tuple(a.shape) if isinstance(a, Indexed) else tuple(np.shape(a))


def check_streams(xb: Any, yb: Any) -> None:
    """Raises ``ValueError`` (one line) unless ``xb`` and ``yb`` are both arrays or both
    :class:`Indexed` with valid indices (:meth:`Indexed.check`), and ``yb``'s shape leads
    ``xb``'s (a label per example, or per position of a sequence: a shorter ``yb`` would be
    read past its end, where JAX clamps the index instead of failing)."""
    if isinstance(xb, Indexed) != isinstance(yb, Indexed):
        raise ValueError("xb and yb must both be arrays or both be Indexed")
    for name, a in (("xb", xb), ("yb", yb)):
        if isinstance(a, Indexed):
            a.check(name)
    check_pairs(stream_shape(xb), stream_shape(yb), "xb", "yb")


def check_pairs(x: tuple[int, ...], y: tuple[int, ...], xn: str, yn: str) -> None:
    """One line unless shape ``y`` is the leading part of shape ``x``."""
    if not y or x[: len(y)] != y:
        raise ValueError(
            f"{xn} has shape {x} and {yn} {y}: {yn} must have one label per example of {xn} "
            f"(its shape the leading part of {xn}'s)"
        )


def materialised(xb: Any, yb: Any) -> tuple[np.ndarray, np.ndarray]:
    """``xb`` and ``yb`` as NumPy arrays, :class:`Indexed` streams checked and gathered (what
    the mesh executors hand their devices)."""
    check_streams(xb, yb)
    return (xb.gathered(), yb.gathered()) if isinstance(xb, Indexed) else (
        np.asarray(xb), np.asarray(yb))  # fmt: skip


def batch_indices(n: int, *, batch_size: int, num_steps: int, seed: int) -> np.ndarray:
    """Example indices of every batch: ``[num_steps, batch_size]`` int64 (see :func:`batches`).

    Use this instead of :func:`batches` when the pre-batched copies would be too large: gather
    ``x[idx[t]]`` per step (on device, from one copy of ``x``).

    Args:
      n: number of examples.
      batch_size: examples per batch, ``1 <= batch_size <= n``.
      num_steps: number of batches, ``>= 0``.
      seed: seed of ``np.random.default_rng``.

    Returns:
      ``idx`` with ``idx[t]`` the indices of batch ``t``.

    Example:
      >>> from jaxstale.data import batch_indices
      >>> batch_indices(5, batch_size=2, num_steps=3, seed=0).tolist()
      [[2, 4], [3, 0], [4, 1]]
    """
    for arg, value in (("n", n), ("batch_size", batch_size), ("num_steps", num_steps)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__}.")
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be in [1, {n}] (number of examples), got {batch_size}.")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}.")
    rng = np.random.default_rng(seed)
    per_epoch = n // batch_size
    epochs = -(-num_steps // per_epoch)
    idx = [rng.permutation(n)[: per_epoch * batch_size] for _ in range(epochs)]
    flat = np.concatenate(idx) if idx else np.zeros((0,), dtype=np.int64)
    return flat[: num_steps * batch_size].reshape(num_steps, batch_size)


def batches(
    x: np.ndarray, y: np.ndarray, *, batch_size: int, num_steps: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    r"""Seeded epochs cut into batches: ``xb[num_steps, batch_size, ...]``, ``yb[num_steps, B]``.

    With ``rng = np.random.default_rng(seed)`` each epoch ``e`` draws a permutation
    :math:`\pi_e = ` ``rng.permutation(N)`` and cuts it into :math:`\lfloor N / B \rfloor`
    batches (the remainder :math:`N \bmod B` is dropped); epochs are concatenated and the first
    ``num_steps`` batches returned. Same seed, same batches (bitwise); every epoch visits each
    example at most once. The result is a copy of ``num_steps * batch_size`` examples: for big
    runs on big data use :func:`batch_indices` and gather per step.

    Args:
      x: ``[N, ...]`` inputs.
      y: ``[N]`` labels.
      batch_size: examples per batch, ``1 <= batch_size <= N``.
      num_steps: number of batches (training steps), ``>= 0``.
      seed: seed of the batch order.

    Returns:
      ``(xb, yb)`` NumPy arrays (same dtypes as ``x``, ``y``); ``jnp.asarray`` them to put the
      whole run on the device, e.g. as the ``xs`` of a ``lax.scan``.

    Raises:
      ValueError: ``x`` and ``y`` differ in length, or ``batch_size`` / ``num_steps`` out of range.

    Example:
      >>> import numpy as np
      >>> from jaxstale.data import batches
      >>> x = np.arange(10, dtype=np.float32).reshape(5, 2)
      >>> xb, yb = batches(x, np.arange(5), batch_size=2, num_steps=3, seed=0)
      >>> xb.shape, yb.tolist()
      ((3, 2, 2), [[2, 4], [3, 0], [4, 1]])
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 1 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(
            f"x must be [N, ...] and y [N] with the same N, got shapes {x.shape} and {y.shape}."
        )
    idx = batch_indices(len(x), batch_size=batch_size, num_steps=num_steps, seed=seed)
    return x[idx], y[idx]


def indexed(x: Any, idx: Any) -> Indexed:
    """``Indexed(x, idx)``, compacted (:meth:`Indexed.compact`) where ``x`` is not an array in
    memory (a token file's windows): the run's rows are read, not the file."""
    got = Indexed(x, idx)
    return got if isinstance(x, np.ndarray) else got.compact()
