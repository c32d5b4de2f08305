"""The model zoo: MLP, a LeNet-5-style CNN and the CIFAR ResNet-20, each a :class:`StagedModel`.

All models take NHWC float32 images ``[B, H, W, C]`` and return logits ``[B, num_classes]``.
:func:`register_model` adds your own Flax NNX model under a name that :func:`create` (and so the
experiments) accept; :func:`model_names` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstale._checks import check_name
from jaxstale.models.staged import StagedModel

__all__ = [
    "MODELS",
    "BasicBlock",
    "ConvPool",
    "Dense",
    "Head",
    "Stem",
    "check_logits",
    "cnn",
    "create",
    "mlp",
    "model_names",
    "register_model",
    "registered_builder",
    "resnet20",
]

MODELS: tuple[str, ...] = ("mlp", "cnn", "resnet20")
"""The built-in model names (see :func:`model_names` for the registered ones too)."""


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


def _check(input_shape: Sequence[int], num_classes: int) -> tuple[int, int, int]:
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(_is_int(d) and d >= 1 for d in shape):
        raise ValueError(f"input_shape must be (H, W, C) with positive ints, got {input_shape!r}.")
    if not _is_int(num_classes) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}.")
    h, w, c = (int(d) for d in shape)
    return h, w, c


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _ints(name: str, values: Sequence[int]) -> tuple[int, ...]:
    values = tuple(values)
    if not all(_is_int(v) and v >= 1 for v in values):
        raise ValueError(f"{name} must be positive ints, got {values!r}.")
    return tuple(int(v) for v in values)


def _build(
    blocks_fn: Callable[..., list[nnx.Module]],
    shape: tuple[int, int, int],
    num_classes: int,
    seed: int,
    **kwargs: Any,
) -> StagedModel:
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}.")
    return StagedModel(blocks_fn(shape, num_classes, nnx.Rngs(int(seed)), **kwargs))


def mlp(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    hidden: Sequence[int] = (256, 128),
    seed: int = 0,
) -> StagedModel:
    r"""Multi-layer perceptron: flatten, ``len(hidden)`` ReLU layers, a linear output layer.

    .. math::

        h_0 = \mathrm{vec}(x), \quad h_{l+1} = \mathrm{relu}(W_l h_l + b_l), \quad
        z = W_{L} h_{L} + b_{L}

    One block per linear layer (``len(hidden) + 1`` blocks), so it splits into up to that many
    stages.

    Args:
      input_shape: ``(H, W, C)`` of one input image.
      num_classes: number of output logits.
      hidden: widths of the hidden layers.
      seed: initialisation seed.

    Returns:
      A :class:`StagedModel`.

    Example:
      >>> from jaxstale.models import mlp, param_count
      >>> model = mlp((8, 8, 1), 10)
      >>> len(model.blocks), param_count(model)
      (3, 50826)
    """
    shape = _check(input_shape, num_classes)
    return _build(_mlp_blocks, shape, num_classes, seed, hidden=_ints("hidden", hidden))


def _mlp_blocks(shape, num_classes, rngs, *, hidden):
    h, w, c = shape
    widths = [h * w * c, *hidden, num_classes]
    return [
        Dense(widths[i], widths[i + 1], relu=i < len(hidden), flatten=i == 0, rngs=rngs)
        for i in range(len(widths) - 1)
    ]


def cnn(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    channels: Sequence[int] = (6, 16),
    hidden: Sequence[int] = (120, 84),
    kernel: int = 5,
    seed: int = 0,
) -> StagedModel:
    r"""LeNet-5-style CNN: two conv/ReLU/max-pool blocks, then 120-84-``num_classes`` dense.

    ``conv 6@5x5 -> relu -> maxpool 2 -> conv 16@5x5 -> relu -> maxpool 2 -> flatten ->
    dense 120 -> relu -> dense 84 -> relu -> dense num_classes``. Convolutions and pooling use
    'SAME' padding, so any input size works (8x8 digits: 8 -> 4 -> 2; 28x28: 28 -> 14 -> 7;
    32x32: 32 -> 16 -> 8, spatial sizes :math:`\lceil H / 2 \rceil` per pool). Departures from
    the 1998 network: ReLU and max-pooling instead of scaled tanh and trainable sub-sampling,
    full C3 connectivity, a linear output layer instead of RBF units. Five blocks (each conv block,
    each dense layer).

    Args:
      input_shape: ``(H, W, C)``.
      num_classes: number of output logits.
      channels: output channels of the two conv layers.
      hidden: widths of the dense hidden layers.
      kernel: conv kernel size.
      seed: initialisation seed.

    Returns:
      A :class:`StagedModel` with ``len(channels) + len(hidden) + 1`` blocks.

    Example:
      >>> from jaxstale.models import cnn, param_count
      >>> model = cnn((28, 28, 1), 10)
      >>> len(model.blocks), param_count(model)
      (5, 107786)

    References:
      LeCun, Bottou, Bengio, Haffner. Gradient-based learning applied to document
      recognition. Proceedings of the IEEE, 86(11), 1998.
    """
    shape = _check(input_shape, num_classes)
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1:
        raise ValueError(f"kernel must be a positive int, got {kernel!r}.")
    return _build(
        _cnn_blocks,
        shape,
        num_classes,
        seed,
        channels=_ints("channels", channels),
        hidden=_ints("hidden", hidden),
        kernel=kernel,
    )


def _cnn_blocks(shape, num_classes, rngs, *, channels, hidden, kernel):
    h, w, c = shape
    blocks: list[nnx.Module] = []
    in_ch = c
    for ch in channels:
        blocks.append(ConvPool(in_ch, ch, kernel, rngs=rngs))
        in_ch = ch
        h, w = -(-h // 2), -(-w // 2)
    widths = [h * w * in_ch, *hidden, num_classes]
    for i in range(len(widths) - 1):
        blocks.append(
            Dense(widths[i], widths[i + 1], relu=i < len(hidden), flatten=i == 0, rngs=rngs)
        )
    return blocks


def resnet20(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    width: int = 16,
    blocks_per_stage: int = 3,
    seed: int = 0,
) -> StagedModel:
    r"""The CIFAR ResNet-20 of He et al. (2016), with batch-norm and option-A shortcuts.

    ``conv 3x3@16 + BN + relu``, then three stages of ``blocks_per_stage`` basic blocks with
    16, 32, 64 channels (the first block of stages 2 and 3 has stride 2), then global average
    pooling and a linear layer: :math:`6n + 2 = 20` weighted layers for :math:`n = 3`. Residual
    blocks compute :math:`\mathrm{relu}(F(x) + S(x))` with ``F = BN(conv(relu(BN(conv(x)))))``
    and the parameter-free option-A shortcut ``S`` (identity; on down-sampling, stride-2
    sub-sampling plus zero channels), as in the paper's CIFAR experiments and the DC-ASGD and
    Gap-Aware papers. Convolutions have no bias and He-normal initialisation; batch-norm momentum
    0.9 (PyTorch's 0.1), epsilon 1e-5. Batch statistics are ``nnx.BatchStat`` variables that follow
    ``model.train()`` / ``model.eval()``.

    Blocks: the stem, each residual block, and the head (pool + linear):
    ``3 * blocks_per_stage + 2`` = 11 blocks.

    Args:
      input_shape: ``(H, W, C)``, e.g. ``(32, 32, 3)`` for CIFAR-10.
      num_classes: number of output logits.
      width: channels of the first stage (16 in the paper; stages use 1x, 2x, 4x).
      blocks_per_stage: residual blocks per stage, ``n`` (3 gives ResNet-20).
      seed: initialisation seed.

    Returns:
      A :class:`StagedModel` in train mode.

    Example:
      >>> from jaxstale.models import resnet20, param_count
      >>> model = resnet20((32, 32, 3), 10)
      >>> len(model.blocks), param_count(model)
      (11, 269722)

    References:
      He, Zhang, Ren, Sun. Deep residual learning for image recognition. CVPR 2016.
      https://arxiv.org/abs/1512.03385
    """
    shape = _check(input_shape, num_classes)
    (width,) = _ints("width", (width,))
    (blocks_per_stage,) = _ints("blocks_per_stage", (blocks_per_stage,))
    return _build(
        _resnet20_blocks, shape, num_classes, seed, width=width, blocks_per_stage=blocks_per_stage
    )


def _resnet20_blocks(shape, num_classes, rngs, *, width, blocks_per_stage):
    c = shape[2]
    blocks: list[nnx.Module] = [Stem(c, width, rngs=rngs)]
    in_ch = width
    for stage in range(3):
        out_ch = width * 2**stage
        for b in range(blocks_per_stage):
            stride = 2 if stage > 0 and b == 0 else 1
            blocks.append(BasicBlock(in_ch, out_ch, stride, rngs=rngs))
            in_ch = out_ch
    blocks.append(Head(in_ch, num_classes, rngs=rngs))
    return blocks


_BUILDERS: dict[str, Callable[..., StagedModel]] = {"mlp": mlp, "cnn": cnn, "resnet20": resnet20}

# Registered models (not the built-ins), in registration order.
_REGISTRY: dict[str, Callable[..., nnx.Module]] = {}


def model_names() -> tuple[str, ...]:
    """Every name :func:`create` accepts: the built-in :data:`MODELS`, then registered ones.

    Returns:
      The names, built-ins first, registered models in registration order.

    Example:
      >>> from jaxstale import models
      >>> models.model_names()[:3]
      ('mlp', 'cnn', 'resnet20')
    """
    return MODELS + tuple(_REGISTRY)


def register_model(name: str, build: Callable[..., nnx.Module], *, overwrite: bool = False) -> None:
    """Make ``create(name, ...)`` build your own Flax NNX model.

    ``build(*, input_shape, num_classes, seed, **kwargs)`` returns an ``nnx.Module`` mapping NHWC
    float32 inputs ``[B, *input_shape]`` to logits ``[B, num_classes]``; ``seed`` must fix its
    initialisation (same seed, same weights) and ``kwargs`` are the model options passed to
    :func:`create`. The experiments then take the name like a built-in one:

    - a plain ``nnx.Module`` works wherever the whole model is trained at once (the synchronous
      trainer, the asynchronous data-parallel emulator and mesh executor), through
      :func:`~jaxstale.models.functional`;
    - pipelines need the model cut into stages: return a :class:`StagedModel` (an ordered
      sequence of blocks) to allow that; :func:`~jaxstale.models.split` and
      :func:`~jaxstale.models.functional_stages` raise ``TypeError`` for any other module.

    Args:
      name: a new model name (a non-empty string; not one of :data:`MODELS`).
      build: the builder described above.
      overwrite: replace a model registered earlier under ``name`` (built-ins can never be
        replaced).

    Raises:
      ValueError: ``name`` holds a comma or whitespace (``--model`` takes a comma-separated list),
        is a built-in, or is already registered and ``overwrite`` is False.
      TypeError: ``name`` is not a non-empty string or ``build`` is not callable.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from jaxstale import models
      >>> class Linear(nnx.Module):
      ...     def __init__(self, din, dout, rngs):
      ...         self.linear = nnx.Linear(din, dout, rngs=rngs)
      ...     def __call__(self, x):
      ...         return self.linear(x.reshape(x.shape[0], -1))
      >>> def build(*, input_shape, num_classes, seed):
      ...     din = int(jnp.prod(jnp.array(input_shape)))
      ...     return Linear(din, num_classes, nnx.Rngs(seed))
      >>> models.register_model("linear", build)
      >>> model = models.create("linear", input_shape=(8, 8, 1), num_classes=10, seed=0)
      >>> model(jnp.zeros((4, 8, 8, 1))).shape, "linear" in models.model_names()
      ((4, 10), True)
    """
    check_name(name, "register_model", "model name")
    if not callable(build):
        raise TypeError(f"build must be callable, got {type(build).__name__}.")
    if name in MODELS:
        raise ValueError(f"{name!r} is a built-in model and cannot be replaced.")
    if name in _REGISTRY and not overwrite:
        raise ValueError(
            f"Model {name!r} is already registered; pass overwrite=True to replace it."
        )
    _REGISTRY[name] = build


@overload
def create(
    name: Literal["mlp", "cnn", "resnet20"],
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    seed: int = 0,
    **kwargs: Any,
) -> StagedModel: ...


@overload
def create(
    name: str,
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    seed: int = 0,
    **kwargs: Any,
) -> nnx.Module: ...


def create(
    name: str,
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    seed: int = 0,
    **kwargs: Any,
) -> nnx.Module:
    """Build a model by name: one of :data:`MODELS` or a name added with :func:`register_model`.

    Args:
      name: ``"mlp"``, ``"cnn"``, ``"resnet20"`` or a registered name (see :func:`model_names`).
      input_shape: ``(H, W, C)`` of one NHWC input image.
      num_classes: number of output logits.
      seed: initialisation seed (same seed, same weights).
      **kwargs: model-specific options passed to :func:`mlp` (``hidden``), :func:`cnn`
        (``channels``, ``hidden``, ``kernel``), :func:`resnet20` (``width``,
        ``blocks_per_stage``) or a registered builder, e.g. to make a tiny model for tests.

    Returns:
      A :class:`StagedModel` for the built-in names (in NNX's default train mode); whatever
      ``nnx.Module`` a registered builder returns.

    Raises:
      ValueError: unknown ``name`` (the message lists :func:`model_names`) or bad shapes.
      TypeError: a registered builder returned something that is not an ``nnx.Module``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale import models
      >>> model = models.create("cnn", input_shape=(8, 8, 1), num_classes=10, seed=0)
      >>> model(jnp.zeros((4, 8, 8, 1))).shape
      (4, 10)
    """
    if name in _BUILDERS:
        return _BUILDERS[name](
            input_shape,
            int(num_classes) if _is_int(num_classes) else num_classes,
            seed=seed,
            **kwargs,
        )
    if name not in _REGISTRY:
        raise ValueError(f"Unknown model {name!r}; registered models: {', '.join(model_names())}.")
    model = _REGISTRY[name](
        input_shape=tuple(input_shape), num_classes=num_classes, seed=seed, **kwargs
    )
    if not isinstance(model, nnx.Module):
        raise TypeError(
            f"The builder of model {name!r} must return an nnx.Module, got {type(model).__name__}."
        )
    return check_logits(model, tuple(input_shape), num_classes, f"create: model {name!r}")


def check_logits(
    model: nnx.Module, input_shape: tuple[int, ...], num_classes: int, where: str = "model"
) -> nnx.Module:
    """``model`` if it maps a batch ``[2, *input_shape]`` to logits ``[2, num_classes]``
    (traced abstractly with ``jax.eval_shape``: no compute, the model is not changed), else one
    ``ValueError`` line starting with ``where``. A model with the wrong number of outputs would
    otherwise train against out-of-range labels and show up as a "diverged" run.

    Example:
      >>> from flax import nnx
      >>> check_logits(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), (4,), 10, "fit")
      Traceback (most recent call last):
      ValueError: fit: maps a batch of 2 inputs (4,) to logits of shape (2, 3); ... (2, 10) needed
    """
    graphdef, state = nnx.split(model)
    x = jax.ShapeDtypeStruct((2, *input_shape), jnp.float32)
    try:
        out = jax.eval_shape(lambda st, x: nnx.merge(graphdef, st)(x), state, x)
    except Exception as e:  # a shape error deep in the user's module: say where it came from
        raise ValueError(f"{where}: cannot take inputs {tuple(input_shape)}: {e}") from None
    got = getattr(out, "shape", None)
    if got != (2, num_classes):
        raise ValueError(
            f"{where}: maps a batch of 2 inputs {tuple(input_shape)} to logits of shape "
            f"{got if got is not None else type(out).__name__}; the data has {num_classes} "
            f"classes: (2, {num_classes}) needed"
        )
    return model


def registered_builder(name: str) -> Callable[..., nnx.Module] | None:
    """The builder registered under ``name`` with :func:`register_model`; None for a built-in
    or unknown name (what a run's code fingerprint records as user code).

    Example:
      >>> from jaxstale import models
      >>> models.registered_builder("mlp") is None
      True
    """
    return _REGISTRY.get(name)
