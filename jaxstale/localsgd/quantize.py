"""Low-precision pseudo-gradient exchange: rowwise absmax float8 (e4m3), as torchft does it,
and the same scheme in a 4-bit float (e2m1).

Streaming DiLoCo exchanges pseudo-gradients in low precision. torchft's fp8 all-reduce quantizes
each row of each tensor on its own: ``scale = 448 / max|row|`` (a zero row keeps scale 1), the
row times its scale rounded to float8 e4m3 (448 is e4m3's largest finite value), dequantized as
``q / scale``; the replicas' dequantized rows are summed in float32, the sum divided by ``M``
is quantized the same way again, and that is the result:

    mean_fp8(Δ_1 … Δ_M) = Q( Σ_m Q(Δ_m) / M )

A tensor's rows are its leading axis (its other axes flattened: torchft takes 2-D tensors); a
1-D tensor is one column, so each element is its own row and survives exactly; a scalar is one
row of one element. Rounding is to nearest even, and values are clipped to ±448 first
(saturating), which only the scale's own rounding can reach.

``"fp4"`` is the same scheme with the OCP 4-bit float e2m1 (largest finite value 6; values 0,
0.5, 1, 1.5, 2, 3, 4, 6): the Streaming DiLoCo paper exchanges 4-bit floats with float32
accumulation; that its format is e2m1 was not verified here (torchft has fp8 only).

References:
    Douillard et al., "Streaming DiLoCo with overlapping communication", arXiv:2501.18512
    (low-precision exchange). meta-pytorch/torchft ``torchft/quantization.py``
    (``_fused_kernel_quantize_into_fp8``, ``_fused_kernel_reduce_fp8``, ``_prepare_quantize_fp8``)
    at commit 001d404c75ed5eddaac49b38ca45f5ce3df19202.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "FORMATS",
    "FP8_MAX",
    "exchange_mean",
    "exchange_one",
    "fp8_mean",
    "fp8_rowwise",
    "quantized_mean",
    "rowwise",
]

#: float8 e4m3's largest finite value
FP8_MAX = 448.0
#: the low-precision formats: dtype and its largest finite value
FORMATS = {"fp8": (jnp.float8_e4m3fn, FP8_MAX), "fp4": (jnp.float4_e2m1fn, 6.0)}


def _rows(x: jax.Array) -> jax.Array:
    if x.ndim == 0:
        return x.reshape(1, 1)
    if x.ndim == 1:
        return x.reshape(-1, 1)
    return x.reshape(x.shape[0], -1)


def rowwise(x: jax.Array, fmt: str = "fp8") -> jax.Array:
    """``x`` quantized to the ``fmt`` float (:data:`FORMATS`) row by row (absmax scale) and
    dequantized, in ``x``'s shape and dtype.

    Example (fp4: row 1's scale 6/2 = 3; 0.5·3 = 1.5, -1.0·3 = -3 exact; row 2: 0.1·20 = 2):
        >>> import jax.numpy as jnp
        >>> rowwise(jnp.array([[2.0, 0.5, -1.0], [0.3, 0.0, 0.1]]), "fp4").tolist()
        [[2.0, 0.5, -1.0], [0.30000001192092896, 0.0, 0.10000000149011612]]
    """
    dtype, top_value = FORMATS[fmt]
    rows = _rows(x).astype(jnp.float32)
    top = jnp.max(jnp.abs(rows), axis=1, keepdims=True)
    scale = jnp.where(top > 0, top_value / jnp.where(top > 0, top, 1.0), 1.0)
    q = jnp.clip(rows * scale, -top_value, top_value).astype(dtype)
    return (q.astype(jnp.float32) / scale).reshape(x.shape).astype(x.dtype)


def fp8_rowwise(x: jax.Array) -> jax.Array:
    """``x`` quantized to float8 e4m3 row by row (absmax scale) and dequantized, in ``x``'s
    shape and dtype.

    Example (row 2: scale 448/0.3; 0.1·scale = 149.3 rounds to e4m3's 144, read back 0.0964):
        >>> import jax.numpy as jnp
        >>> fp8_rowwise(jnp.array([[1.0, 0.5, -2.0], [0.3, 0.0, 0.1]])).tolist()
        [[1.0, 0.5, -2.0], [0.30000001192092896, 0.0, 0.09642857313156128]]
    """
    return rowwise(x, "fp8")


def quantized_mean(deltas: Any, fmt: str = "fp8") -> Any:
    """The replicas' mean of a pytree whose leaves carry a leading replica axis ``[M, ...]``,
    exchanged in ``fmt``: ``Q(Σ_m Q(Δ_m) / M)`` leaf by leaf, the sum in float32."""

    def one(d: jax.Array) -> jax.Array:
        summed = jnp.sum(jax.vmap(lambda r: rowwise(r, fmt))(d).astype(jnp.float32), axis=0)
        return rowwise(summed / d.shape[0], fmt).astype(d.dtype)

    return jax.tree.map(one, deltas)


def fp8_mean(deltas: Any) -> Any:
    """:func:`quantized_mean` in fp8.

    Example:
        >>> import jax.numpy as jnp
        >>> fp8_mean({"w": jnp.array([[1.0, 3.0], [3.0, 1.0]])})["w"].tolist()
        [2.0, 2.0]
    """
    return quantized_mean(deltas, "fp8")


def exchange_mean(deltas: Any, exchange: str) -> Any:
    """The replicas' mean of ``[M, ...]`` leaves as ``exchange`` (``"fp32"``, ``"fp8"``,
    ``"fp4"``) delivers it; a list of leaves stays a list."""
    if exchange == "fp32":
        return jax.tree.map(lambda d: jnp.mean(d, axis=0), deltas)
    return quantized_mean(deltas, exchange)


def exchange_one(delta: Any, exchange: str) -> Any:
    """One replica's pseudo-gradient as ``exchange`` delivers it (``Q(Q(Δ)) = Q(Δ)``)."""
    if exchange == "fp32":
        return delta
    return jax.tree.map(lambda d: rowwise(d, exchange), delta)
