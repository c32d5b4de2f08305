"""The model zoo: MLP, a LeNet-5-style CNN, the CIFAR ResNet-20 and a 1-D CNN, each a
:class:`StagedModel`.

The image models take NHWC float32 images ``[B, H, W, C]``, the 1-D CNN sequences ``[B, L, C]``
(the MLP either); all return logits ``[B, num_classes]``.
:func:`register_model` adds your own Flax NNX model under a name that :func:`create` (and so the
experiments) accept; :func:`model_names` lists them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstale._checks import check_name
from jaxstale.models.gpt import PRESETS as GPT_PRESETS
from jaxstale.models.gpt import preset_builder, preset_name
from jaxstale.models.layers import (
    BasicBlock,
    Conv1D,
    ConvPool,
    Dense,
    Head,
    Stem,
    _build,
    _check,
    _ints,
    _is_int,
)
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
    "cnn1d",
    "create",
    "mlp",
    "model_names",
    "register_model",
    "registered_builder",
    "resnet20",
]

MODELS: tuple[str, ...] = (
    "mlp",
    "cnn",
    "resnet20",
    "cnn1d",
    *(preset_name(k) for k in GPT_PRESETS),
)
"""The built-in model names (see :func:`model_names` for the registered ones too)."""


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
      input_shape: ``(H, W, C)`` of one input image, or ``(L, C)`` of one sequence (MNIST-1D).
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
    shape = _check(input_shape, num_classes, ranks=(3, 2))
    return _build(_mlp_blocks, shape, num_classes, seed, hidden=_ints("hidden", hidden))


def _mlp_blocks(shape, num_classes, rngs, *, hidden):
    widths = [math.prod(shape), *hidden, num_classes]
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


def cnn1d(
    input_shape: Sequence[int],
    num_classes: int,
    *,
    channels: Sequence[int] = (32, 32, 32),
    kernel: int = 5,
    stride: int = 2,
    seed: int = 0,
) -> StagedModel:
    r"""1-D CNN for sequences ``[B, L, C]`` (MNIST-1D: ``L = 40, C = 1``): strided convolutions,
    then a linear classifier.

    ``conv k@channels[0], stride s -> relu -> … -> conv k@channels[-1], stride s -> relu ->
    flatten -> dense num_classes``, 'SAME' padding (length :math:`L \to \lceil L / s \rceil` per
    layer: 40 -> 20 -> 10 -> 5 by default). The shape of the MNIST-1D paper's CNN (three strided
    convolutions and a linear layer; there 25 channels, kernels 5/3/3, padding 1), with He-normal
    convolutions and 32 channels everywhere. One block per layer (``len(channels) + 1``).

    Args:
      input_shape: ``(L, C)`` of one sequence.
      num_classes: number of output logits.
      channels: output channels of the convolutions.
      kernel: kernel length.
      stride: stride of every convolution.
      seed: initialisation seed.

    Returns:
      A :class:`StagedModel`.

    Example:
      >>> from jaxstale.models import cnn1d, param_count
      >>> model = cnn1d((40, 1), 10)
      >>> len(model.blocks), param_count(model)
      (4, 12106)

    References:
      S. Greydanus, D. Kobak. Scaling down deep learning with MNIST-1D. ICML 2024.
      https://arxiv.org/abs/2011.14439
    """
    shape = _check(input_shape, num_classes, ranks=(2,))
    (kernel, stride) = _ints("kernel and stride", (kernel, stride))
    return _build(
        _cnn1d_blocks,
        shape,
        num_classes,
        seed,
        channels=_ints("channels", channels),
        kernel=kernel,
        stride=stride,
    )


def _cnn1d_blocks(shape, num_classes, rngs, *, channels, kernel, stride):
    length, in_ch = shape
    blocks: list[nnx.Module] = []
    for ch in channels:
        blocks.append(Conv1D(in_ch, ch, kernel, stride, rngs=rngs))
        in_ch, length = ch, -(-length // stride)
    blocks.append(Dense(length * in_ch, num_classes, relu=False, flatten=True, rngs=rngs))
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


_BUILDERS: dict[str, Callable[..., StagedModel]] = {
    "mlp": mlp,
    "cnn": cnn,
    "resnet20": resnet20,
    "cnn1d": cnn1d,
    **{preset_name(k): preset_builder(k) for k in GPT_PRESETS},
}

# Registered models (not the built-ins), in registration order.
_REGISTRY: dict[str, Callable[..., nnx.Module]] = {}


def model_names() -> tuple[str, ...]:
    """Every name :func:`create` accepts: the built-in :data:`MODELS`, then registered ones.

    Returns:
      The names, built-ins first, registered models in registration order.

    Example:
      >>> from jaxstale import models
      >>> models.model_names()[:4]
      ('mlp', 'cnn', 'resnet20', 'cnn1d')
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
    name: Literal["mlp", "cnn", "resnet20", "cnn1d"],
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    task: str = "classification",
    **kwargs: Any,
) -> StagedModel: ...


@overload
def create(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    task: str = "classification",
    **kwargs: Any,
) -> nnx.Module: ...


def create(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    task: str = "classification",
    **kwargs: Any,
) -> nnx.Module:
    """Build a model by name: one of :data:`MODELS` or a name added with :func:`register_model`.

    Args:
      name: ``"mlp"``, ``"cnn"``, ``"resnet20"`` or a registered name (see :func:`model_names`).
      input_shape: ``(H, W, C)`` of one NHWC input image (``(L, C)`` of one sequence for
        ``mlp`` and ``cnn1d``).
      num_classes: number of output logits.
      seed: initialisation seed (same seed, same weights).
      task: ``"classification"`` or ``"language_model"`` (:data:`jaxstale.tasks.KINDS`): the
        logits a registered model must produce (:func:`check_logits`); not passed to builders.
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
    return check_logits(
        model, tuple(input_shape), num_classes, f"create: model {name!r}", task=task
    )


def check_logits(
    model: nnx.Module,
    input_shape: tuple[int, ...],
    num_classes: int,
    where: str = "model",
    *,
    task: str = "classification",
) -> nnx.Module:
    """``model`` if it maps a batch ``[2, *input_shape]`` to logits ``[2, num_classes]``
    (traced abstractly with ``jax.eval_shape``: no compute, the model is not changed), else one
    ``ValueError`` line starting with ``where``. A model with the wrong number of outputs would
    otherwise train against out-of-range labels and show up as a "diverged" run. With
    ``task="language_model"`` the inputs are int32 token ids ``[2, T]`` and the logits must be
    ``[2, T, num_classes]`` (one next-token prediction per position), or ``[2, T, V]`` with
    ``V > num_classes``: a padded vocabulary (``gpt2-small``'s 50,304), whose extra logits no
    target names.

    Example:
      >>> from flax import nnx
      >>> check_logits(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), (4,), 10, "fit")
      Traceback (most recent call last):
      ValueError: fit: maps a batch of 2 inputs (4,) to logits of shape (2, 3); ... (2, 10) needed
    """
    graphdef, state = nnx.split(model)
    lm = task == "language_model"
    x = jax.ShapeDtypeStruct((2, *input_shape), jnp.int32 if lm else jnp.float32)
    try:
        out = jax.eval_shape(lambda st, x: nnx.merge(graphdef, st)(x), state, x)
    except Exception as e:  # a shape error deep in the user's module: say where it came from
        raise ValueError(f"{where}: cannot take inputs {tuple(input_shape)}: {e}") from None
    got = getattr(out, "shape", None)
    want = (2, *input_shape, num_classes) if lm else (2, num_classes)
    padded = lm and isinstance(got, tuple) and got[:-1] == want[:-1] and got[-1] > num_classes
    if got != want and not padded:
        what = f"a vocabulary of {num_classes}" if lm else f"{num_classes} classes"
        raise ValueError(
            f"{where}: maps a batch of 2 inputs {tuple(input_shape)} to logits of shape "
            f"{got if got is not None else type(out).__name__}; the data has {what}: "
            f"{want} needed"
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
