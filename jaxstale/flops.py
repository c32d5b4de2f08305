r"""Model FLOPs per token and model FLOPs utilisation (MFU) of a GPT's training step.

The standard count (Kaplan et al. 2020, §2.1; the PaLM paper's Appendix B, which nanoGPT's
``estimate_mfu`` follows): a training step does, per token,

.. math::

    6N + 12 \, L \, H \, Q \, T

floating-point operations — ``6N`` for the matrix products of the ``N`` non-embedding weights
in the forward (2) and the backward (4), plus the attention's scores and weighted sums over the
``T`` positions of a window (``L`` blocks, ``H`` heads of width ``Q = D / H``: ``2·2·H·Q·T`` in the
forward, twice that in the backward). ``N`` leaves out the position table, which is read, not
multiplied (nanoGPT's ``non_embedding``), and counts the token embedding only where it is a
matrix product — in jaxstale's GPT the output head is a separate matrix (counted), the input
embedding a lookup (not). A step of ``B`` windows is ``B·T`` tokens; the rate achieved is

.. math::

    \mathrm{MFU} = \frac{\text{tokens/s} \cdot (6N + 12 L H Q T)}{\text{peak FLOP/s}}

with the device's dense peak from :data:`PEAK_FLOPS` for the precision the step computes in
(``None`` — "unknown" — for a device or precision not in the table: a CPU's peak depends on its
cores, clock and vector units, so no MFU is given for CPUs).

References:
    J. Kaplan et al., "Scaling Laws for Neural Language Models", arXiv 2001.08361, 2020;
    A. Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways", arXiv 2204.02311,
    2022 (Appendix B); A. Karpathy, nanoGPT (``model.py``, ``estimate_mfu``).

Example:
    GPT-2 small's shape (``gpt2-small``: N = 123.7 M without its lookup tables):

    >>> f = gpt_flops_per_token(layers=12, width=768, heads=12, context=1024, vocab=50304)
    >>> f  # 6 · 123,739,776 + 12 · 12 · 12 · 64 · 1024
    855684864
    >>> round(mfu(1e5, f, "NVIDIA H100 80GB HBM3", "bfloat16"), 3)  # 100k tokens/s
    0.087
    >>> mfu(1e5, f, "cpu", "float32") is None
    True
"""

from __future__ import annotations

__all__ = ["PEAK_FLOPS", "gpt_flops_per_token", "mfu", "peak_flops"]

#: dense peak FLOP/s of known accelerators by precision (vendor data sheets, without sparsity;
#: float32 is the CUDA cores' rate, not TF32's — XLA runs float32 matmuls at TF32 on NVIDIA
#: GPUs by default, so an MFU against the float32 peak can exceed 1; "tf32" is that rate)
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "tf32": 494e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "tf32": 494e12, "float32": 67e12},  # SXM
    "A100": {"bfloat16": 312e12, "tf32": 156e12, "float32": 19.5e12},
    "L4": {"bfloat16": 121e12, "tf32": 60e12, "float32": 30.3e12},
    "TPU v5e": {"bfloat16": 197e12},
    "TPU v4": {"bfloat16": 275e12},
}


def peak_flops(device_kind: str, precision: str) -> float | None:
    """The dense peak of ``device_kind`` (``jax.devices()[0].device_kind``, e.g. ``"NVIDIA
    H100 80GB HBM3"``) in ``precision`` — the first :data:`PEAK_FLOPS` name it contains
    (longest first), case-insensitive — or None when unknown."""
    kind = device_kind.lower()
    for name in sorted(PEAK_FLOPS, key=len, reverse=True):
        if name.lower() in kind:
            return PEAK_FLOPS[name].get(precision)
    return None


def gpt_flops_per_token(*, layers: int, width: int, heads: int, context: int, vocab: int) -> int:
    """``6N + 12·L·H·Q·T`` (module docstring) for :func:`jaxstale.models.gpt.gpt`'s shape:
    ``N = L·(12D² + 13D) + D·V + V + 2D`` (the blocks, the output head and the final norm; not
    the token and position tables, which are lookups), ``Q = D / H``, ``T`` the window length."""
    from jaxstale.models.gpt import gpt_param_count

    n = gpt_param_count(context, vocab, layers=layers, width=width) - (vocab + context) * width
    return 6 * n + 12 * layers * heads * (width // heads) * context


def mfu(
    tokens_per_s: float, flops_per_token: float, device_kind: str, precision: str
) -> float | None:
    """Model FLOPs utilisation: ``tokens_per_s · flops_per_token / peak`` (None: peak unknown)."""
    peak = peak_flops(device_kind, precision)
    return None if peak is None else tokens_per_s * flops_per_token / peak
