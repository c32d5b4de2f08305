"""The layers the model zoo builds from: initialisers, dense and convolution blocks, the
ResNet's residual blocks, argument checks.

Every layer maps ``[B, ...]`` float32 to ``[B, ...]``; the zoo (:mod:`jaxstale.models.zoo`)
strings them into :class:`~jaxstale.models.StagedModel` block sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstale.models.staged import StagedModel

__all__ = ["BasicBlock", "Conv1D", "ConvPool", "Dense", "Head", "Stem"]


def _host_normal(gain: float) -> Callable[..., jax.Array]:
    r"""Host-side initializer :math:`W \sim \mathcal N(0, \mathrm{gain} / \mathrm{fan\_in})`.

    The draw uses ``np.random.default_rng(key_data(key))``: the same key gives the same weights,
    but no XLA program is compiled. (Eager ``jax.random`` initialisation compiles a threefry +
    erf-inverse program per weight shape: measured here, ~2 CPU-seconds per shape, so creating a
    ResNet-20 cost ~17 s; this costs ~0.1 s.) Under tracing (``jax.jit``, ``nnx.eval_shape``) the
    same host function runs through ``jax.pure_callback``, so the numbers do not depend on it.
    ``fan_in`` is the product of all but the last kernel dimension (``kh * kw * c_in`` for convs).
    """

    def draw(key_data: np.ndarray, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        rng = np.random.default_rng(np.asarray(key_data, dtype=np.uint32).ravel().tolist())
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return (rng.standard_normal(shape) * np.sqrt(gain / fan_in)).astype(dtype)

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        if isinstance(key, jax.core.Tracer):
            out = jax.ShapeDtypeStruct(shape, dtype)
            return jax.pure_callback(lambda k: draw(k, shape, dtype), out, key)
        return jnp.asarray(draw(np.asarray(key), shape, dtype))

    return init


_he_normal = _host_normal(2.0)  # layers followed by ReLU (He et al. 2015)
_lecun_normal = _host_normal(1.0)  # the linear output layer


class Dense(nnx.Module):
    """``y = act(W x + b)``, flattening ``x`` to ``[B, -1]`` first if ``flatten``."""

    def __init__(
        self, in_features: int, out_features: int, *, relu: bool, flatten: bool, rngs: nnx.Rngs
    ):
        init = _he_normal if relu else _lecun_normal
        self.linear = nnx.Linear(in_features, out_features, kernel_init=init, rngs=rngs)
        self.relu = relu
        self.flatten = flatten

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.flatten:
            x = x.reshape(x.shape[0], -1)
        y = self.linear(x)
        return nnx.relu(y) if self.relu else y


class ConvPool(nnx.Module):
    """``maxpool_2x2(relu(conv_kxk(x)))`` with 'SAME' padding (odd sizes round up, 1 stays 1)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(
            in_ch, out_ch, (kernel, kernel), padding="SAME", kernel_init=_he_normal, rngs=rngs
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.conv(x))
        return nnx.max_pool(y, (2, 2), strides=(2, 2), padding="SAME")


class Conv1D(nnx.Module):
    """``relu(conv_k(x))`` over the length of ``[B, L, C]`` sequences, stride ``s``, 'SAME'
    padding (``L -> ceil(L / s)``)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(
            in_ch,
            out_ch,
            (kernel,),
            strides=(stride,),
            padding="SAME",
            kernel_init=_he_normal,
            rngs=rngs,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(self.conv(x))


def _bn(ch: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
    # PyTorch's defaults (momentum 0.1 there is 1 - momentum here), as in the reference ResNets.
    return nnx.BatchNorm(ch, momentum=0.9, epsilon=1e-5, rngs=rngs)


def _conv3x3(in_ch: int, out_ch: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    return nnx.Conv(
        in_ch,
        out_ch,
        (3, 3),
        strides=(stride, stride),
        padding="SAME",
        use_bias=False,
        kernel_init=_he_normal,
        rngs=rngs,
    )


class Stem(nnx.Module):
    """ResNet stem: ``relu(bn(conv_3x3(x)))``."""

    def __init__(self, in_ch: int, out_ch: int, *, rngs: nnx.Rngs):
        self.conv = _conv3x3(in_ch, out_ch, 1, rngs)
        self.bn = _bn(out_ch, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(self.bn(self.conv(x)))


class BasicBlock(nnx.Module):
    r"""Residual basic block ``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))``.

    The shortcut is the identity, or, when the block halves the resolution and widens the
    channels, option A of He et al. (2016): ``x[:, ::2, ::2, :]`` zero-padded in the channel
    dimension (no parameters).
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = _conv3x3(in_ch, out_ch, stride, rngs)
        self.bn1 = _bn(out_ch, rngs)
        self.conv2 = _conv3x3(out_ch, out_ch, 1, rngs)
        self.bn2 = _bn(out_ch, rngs)
        self.stride = stride
        self.pad = out_ch - in_ch

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = x
        if self.stride != 1:
            shortcut = shortcut[:, :: self.stride, :: self.stride, :]
        if self.pad:
            lo = self.pad // 2
            shortcut = jnp.pad(shortcut, ((0, 0), (0, 0), (0, 0), (lo, self.pad - lo)))
        return nnx.relu(y + shortcut)


class Head(nnx.Module):
    """Global average pooling over ``H, W`` followed by a linear classifier."""

    def __init__(self, in_ch: int, num_classes: int, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(in_ch, num_classes, kernel_init=_lecun_normal, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(jnp.mean(x, axis=(1, 2)))


def _check(
    input_shape: Sequence[int], num_classes: int, ranks: tuple[int, ...] = (3,)
) -> tuple[int, ...]:
    """``input_shape`` as ints if it has one of ``ranks`` positive sizes (3: ``(H, W, C)``
    images; 2: ``(L, C)`` sequences), else one ``ValueError``; ``num_classes`` checked too."""
    shape = tuple(input_shape)
    if len(shape) not in ranks or not all(_is_int(d) and d >= 1 for d in shape):
        want = " or ".join({3: "(H, W, C)", 2: "(L, C)"}[r] for r in ranks)
        raise ValueError(f"input_shape must be {want} with positive ints, got {input_shape!r}.")
    if not _is_int(num_classes) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
    return tuple(int(d) for d in shape)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    values = tuple(values)
    if not all(_is_int(v) and v >= 1 for v in values):
        raise ValueError(f"{name} must be positive ints, got {values!r}.")
    return tuple(int(v) for v in values)


def _build(
    blocks_fn: Callable[..., list[nnx.Module]],
    shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    **kwargs: Any,
) -> StagedModel:
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}.")
    return StagedModel(blocks_fn(shape, num_classes, nnx.Rngs(int(seed)), **kwargs))
