r"""A decoder-only transformer (GPT) written as a sequence of whole transformer blocks.

``gpt(context, vocab, layers=L, width=D, heads=H)`` is a :class:`StagedModel` of ``L`` blocks,
each a pre-norm transformer block

.. math::

    x \leftarrow x + \mathrm{Attn}(\mathrm{LN}_1(x)), \qquad
    x \leftarrow x + \mathrm{MLP}(\mathrm{LN}_2(x)),

with causal multi-head self-attention (``H`` heads of ``D / H``) and a GELU MLP of width
``4D``. The first block also embeds (token embedding plus a learned position embedding, inputs
``[B, T]`` integer ids, ``T ≤ context``) and the last also has the final layer norm and the
output head (``[B, T, vocab]`` logits), so :func:`jaxstale.models.split` gives pipeline stages
of whole blocks with the embedding in the first stage and the head in the last; the input and
output embeddings are separate matrices (tied weights would span the first and last stage).

Parameters: ``L·(12D² + 13D) + (vocab + context)·D + D·vocab + vocab + 2D`` (each block
``4D² + 4D`` attention, ``8D² + 5D`` MLP, ``4D`` norms; the final norm ``2D``).

References:
    Radford et al., "Language Models are Unsupervised Multitask Learners" (GPT-2), 2019;
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017, arXiv 1706.03762.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxstale._checks import check_range
from jaxstale.models.layers import _host_normal
from jaxstale.models.staged import StagedModel

__all__ = [
    "DTYPES",
    "PRESETS",
    "SAVED_NAMES",
    "GPTBlock",
    "gpt",
    "gpt_param_count",
    "preset_builder",
    "preset_name",
    "preset_of",
]

_init = _host_normal(1.0)  # N(0, 1 / fan_in)

#: the activations a block tags with ``jax.ad_checkpoint.checkpoint_name`` (identity
#: otherwise): the residual stream (the embedding's output, after the attention, a block's
#: output), the two norms' outputs, q/k/v before the heads split and the MLP's pre-activation —
#: what PyTorch autograd keeps of a block, less what is a function of these alone (the
#: attention's scores, probabilities and output, the GELU's output). ``remat="names"``
#: (:mod:`jaxstale.models.remat`) saves only these.
SAVED_NAMES = ("resid", "ln1", "qkv", "ln2", "mlp_up")

#: size presets, the zoo's ``gpt-<name>`` models (context and vocabulary come from the data:
#: at :mod:`jaxstale.text`'s context 64 and 83 characters, the parameter counts are
#: tiny 32,915; cpu 414,803; deep 814,675; gpu 85,232,723). ``gpt2-small`` is GPT-2 small's
#: shape whatever the data: a position table of 1,024 and nanoGPT's padded vocabulary of
#: 50,304 (the data's windows must be at most 1,024 ids and its vocabulary at most 50,304;
#: the head's extra logits learn to be improbable, as nanoGPT's do): 163,159,680 parameters —
#: GPT-2's 124 M plus the separate output embedding (768 × 50,304 = 38.6 M; tied weights
#: would span the first and the last stage). Its 12 blocks split over N stages by parameter
#: count (:func:`jaxstale.models.split`): the embedding block and the head block (46 M each)
#: are stages of their own at N ≥ 3, the ten 7.1 M blocks share the rest — over 8 stages
#: 1, 1, 1, 2, 2, 2, 2, 1 blocks (the largest stage is the embedding's; ties go to the
#: earliest cut). The zoo names it ``gpt2-small`` (the others ``gpt-<preset>``).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "width": 32, "heads": 2},  # tests and smoke runs
    "cpu": {"layers": 8, "width": 64, "heads": 4},  # the CPU claims: up to 8 stages of 1 block
    "deep": {"layers": 16, "width": 64, "heads": 4},  # the CPU preset twice as deep: N = 16
    "gpu": {"layers": 12, "width": 768, "heads": 12},  # GPT-2 small's blocks: for a GPU
    "gpt2-small": {"layers": 12, "width": 768, "heads": 12, "context": 1024, "vocab": 50304},
}


#: the compute precisions of :func:`gpt` (``dtype=``): float32 everywhere, or bfloat16 matrix
#: products with float32 weights, norms, softmax, residual stream and logits
DTYPES = ("float32", "bfloat16")


def _dense(
    d_in: int, d_out: int, rngs: nnx.Rngs, gain: float = 1.0, dtype: Any = None
) -> nnx.Linear:
    init = _init if gain == 1.0 else _host_normal(gain)
    return nnx.Linear(d_in, d_out, kernel_init=init, rngs=rngs, dtype=dtype)


def _check_ids(x: Any, vocab: int) -> None:
    """Token ids must be whole numbers in ``[0, vocab)``: an id outside gave NaN logits (the
    embedding's gather fills with NaN), a fractional one was truncated. Concrete ids are checked
    now (one-line ``ValueError``); traced ones (inside ``jax.jit``) by a ``checkify`` check after
    :func:`jaxstale.enable_traced_checks`, as every traced hyper-parameter is."""
    hint = " (the model's vocabulary: a dataset with more symbols needs a model built for them)"
    if isinstance(x, jax.core.Tracer):
        check_range(x, "token ids", "gpt", 0, vocab, hint=hint)
        return
    ids = np.asarray(jax.device_get(x))
    if ids.size == 0:
        return
    if np.issubdtype(ids.dtype, np.floating) and (ids != np.round(ids)).any():
        raise ValueError("gpt: token ids must be whole numbers, got fractional values")
    lo, hi = ids.min(), ids.max()
    if lo < 0 or hi >= vocab or not np.isfinite([lo, hi]).all():
        raise ValueError(f"gpt: token ids must be in [0, {vocab}){hint}, got ids from {lo} to {hi}")


class GPTBlock(nnx.Module):
    """One pre-norm transformer block; with ``vocab`` and ``context`` it embeds first
    (``embed=True``) and/or ends in the final norm and the head (``head=True``)."""

    def __init__(
        self,
        width: int,
        heads: int,
        *,
        vocab: int,
        context: int,
        embed: bool,
        head: bool,
        layers: int,
        rngs: nnx.Rngs,
        dtype: Any = None,
    ) -> None:
        if width % heads:
            raise ValueError(f"gpt: width {width} is not a multiple of heads {heads}")
        self.heads, self.embed, self.head = heads, embed, head
        if embed:  # GPT-2's N(0, 0.02²) for both embeddings (the initialiser divides by rows)
            std2 = 0.02**2
            init = _host_normal(std2 * vocab)
            self.tokens = nnx.Embed(vocab, width, embedding_init=init, rngs=rngs)
            self.positions = nnx.Param(
                _host_normal(std2 * context)(rngs.params(), (context, width))
            )
        self.ln1 = nnx.LayerNorm(width, rngs=rngs)
        self.qkv = _dense(width, 3 * width, rngs, dtype=dtype)
        self.proj = _dense(width, width, rngs, 1.0 / (2 * layers), dtype)  # residual scaling
        self.ln2 = nnx.LayerNorm(width, rngs=rngs)
        self.up = _dense(width, 4 * width, rngs, dtype=dtype)
        self.down = _dense(4 * width, width, rngs, 1.0 / (2 * layers), dtype)
        if head:
            self.ln_f = nnx.LayerNorm(width, rngs=rngs)
            self.out = _dense(width, vocab, rngs, dtype=dtype)

    def _attend(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h = self.heads
        q, k, v = jnp.split(checkpoint_name(self.qkv(x), "qkv"), 3, axis=-1)
        q, k, v = (a.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for a in (q, k, v))
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d // h)
        causal = jnp.tril(jnp.ones((t, t), bool))
        scores = jnp.where(causal, scores.astype(jnp.float32), -jnp.inf)
        att = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # float32 softmax
        return self.proj((att @ v).transpose(0, 2, 1, 3).reshape(b, t, d))

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.embed:
            t, context = x.shape[1], self.positions.shape[0]
            if t > context:
                raise ValueError(
                    f"gpt: sequences of {t} ids are longer than the context of {context} "
                    "the model was built for"
                )
            _check_ids(x, self.tokens.num_embeddings)
            x = checkpoint_name(self.tokens(x.astype(jnp.int32)) + self.positions[...][:t], "resid")
        x = checkpoint_name(x + self._attend(checkpoint_name(self.ln1(x), "ln1")), "resid")
        up = checkpoint_name(self.up(checkpoint_name(self.ln2(x), "ln2")), "mlp_up")
        x = checkpoint_name(x + self.down(jax.nn.gelu(up)), "resid")
        if self.head:
            x = self.out(self.ln_f(x)).astype(jnp.float32)  # float32 logits, loss
        return x


def gpt(
    context: int,
    vocab: int,
    *,
    layers: int = 4,
    width: int = 64,
    heads: int = 4,
    seed: int = 0,
    dtype: str = "float32",
) -> StagedModel:
    """A GPT of ``layers`` blocks for sequences of up to ``context`` ids over ``vocab`` (see the
    module docstring); the same ``seed`` gives the same weights, whatever ``dtype``.

    ``dtype="bfloat16"``: mixed precision — the matrix products (q/k/v, the attention's two,
    the projection, the MLP and its GELU, the head) compute in bfloat16 from float32 weights
    (the master copy: optimizer state, version buffers and gradients stay float32, the
    gradient of the cast is the cast back); the embeddings, layer norms (float32 statistics),
    the softmax and the residual stream stay float32, and the logits are cast to float32 after
    the bfloat16 head (they carry its rounding), so the loss and its reductions are float32.
    Saved activations of the products are bfloat16: half the backward residuals' bytes.

    Example:
        >>> import jax.numpy as jnp
        >>> model = gpt(16, 50, layers=2, width=32, heads=2)
        >>> len(model.blocks), model(jnp.zeros((3, 16), jnp.int32)).shape
        (2, (3, 16, 50))
    """
    for name, v in (("context", context), ("vocab", vocab), ("layers", layers)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"gpt: {name} must be a positive int, got {v!r}")
    if dtype not in DTYPES:
        raise ValueError(f"gpt: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    compute = jnp.bfloat16 if dtype == "bfloat16" else None
    rngs = nnx.Rngs(seed)
    return StagedModel(
        [
            GPTBlock(
                width,
                heads,
                vocab=vocab,
                context=context,
                embed=i == 0,
                head=i == layers - 1,
                layers=layers,
                rngs=rngs,
                dtype=compute,
            )
            for i in range(layers)
        ]
    )


def gpt_param_count(context: int, vocab: int, *, layers: int, width: int) -> int:
    """The parameter count of :func:`gpt` (the module docstring's formula)."""
    d = width
    return layers * (12 * d * d + 13 * d) + (vocab + context) * d + d * vocab + vocab + 2 * d


def preset_name(preset: str) -> str:
    """The zoo's name of a :data:`PRESETS` key: ``gpt-<preset>``, or the key itself where it
    names a model already (``gpt2-small``)."""
    return preset if preset.startswith("gpt") else f"gpt-{preset}"


def preset_of(model: str) -> dict[str, int] | None:
    """The :data:`PRESETS` shape of the zoo model named ``model`` (``gpt-cpu``, ``gpt2-small``,
    …; a fixed shape has its ``context`` and ``vocab``), or None for any other model."""
    return next((dict(v) for k, v in PRESETS.items() if preset_name(k) == model), None)


def preset_builder(preset: str) -> Any:
    """The zoo builder of ``gpt-<preset>`` (:data:`PRESETS`): ``build(input_shape, vocab, *,
    seed, **overrides)`` with ``input_shape = (context,)``, the data's window length."""
    if preset not in PRESETS:
        raise ValueError(f"unknown GPT preset {preset!r}; choose from: {', '.join(PRESETS)}")

    def build(
        input_shape: tuple[int, ...], num_classes: int, *, seed: int = 0, **kw: Any
    ) -> StagedModel:
        if len(tuple(input_shape)) != 1:
            raise ValueError(
                f"{preset_name(preset)} takes [B, T] token ids (a text dataset), got examples "
                f"of shape {tuple(input_shape)}"
            )
        shape = dict(PRESETS[preset])
        context, vocab = int(input_shape[0]), int(num_classes)
        if "context" in shape:  # a fixed shape: the data must fit it
            context, vocab = shape.pop("context"), shape.pop("vocab")
            if int(input_shape[0]) > context or int(num_classes) > vocab:
                raise ValueError(
                    f"{preset_name(preset)} reads windows of up to {context} ids over a "
                    f"vocabulary of up to {vocab:,}; the data has {int(input_shape[0])} and "
                    f"{int(num_classes):,}"
                )
        return gpt(context, vocab, seed=seed, **{**shape, **kw})

    build.__qualname__ = f"preset_builder.<{preset}>"
    return build
