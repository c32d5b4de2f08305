r"""Group-relative advantages (GRPO): each response scored against the other responses to the
same prompt.

With ``G`` responses per prompt and rewards :math:`R_{g,1..G}`,

.. math::

    A_{g,i} = \frac{R_{g,i} - \bar R_g}{s_g + \varepsilon}, \qquad
    \bar R_g = \frac1G \sum_i R_{g,i}, \quad
    s_g = \sqrt{\tfrac{1}{G - 1} \sum_i (R_{g,i} - \bar R_g)^2},

the unbiased standard deviation (``torch.std``'s default, as verl computes it) and
:math:`\varepsilon = 10^{-6}`; ``normalize=False`` gives the mean-centred reward alone (Dr.
GRPO's choice). A group whose rewards are all equal has advantage 0 throughout: it carries no
signal. Every response id shares its response's advantage.

References:
    Shao et al., "DeepSeekMath", arXiv 2402.03300 (2024), section 4.1 (GRPO, outcome
    supervision).
    Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr. GRPO),
    arXiv 2503.20783 (2025).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["grpo_advantages"]


def grpo_advantages(
    rewards: jax.Array, group_size: int, *, normalize: bool = True, eps: float = 1e-6
) -> jax.Array:
    """Advantages ``[n]`` of rewards ``[n]`` laid out as ``n / group_size`` consecutive groups
    of ``group_size`` responses to one prompt each.

    Example:
        >>> import jax.numpy as jnp
        >>> a = grpo_advantages(jnp.array([1.0, 0.0, 0.5, 0.5]), 2)
        >>> [round(float(x), 4) for x in a]  # (1 - 0.5) / std([1, 0]) = 0.5 / 0.7071
        [0.7071, -0.7071, 0.0, 0.0]

    Raises:
        ValueError: a group size below 2 (no group to compare with), or ``n`` not a multiple
            of it.
    """
    g = int(group_size)
    if g < 2:
        raise ValueError(f"grpo_advantages: group_size must be at least 2, got {group_size}")
    n = rewards.shape[0]
    if n % g:
        raise ValueError(f"grpo_advantages: {n} rewards are not groups of {g}")
    r = rewards.astype(jnp.float32).reshape(n // g, g)
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    if normalize:
        centred = centred / (jnp.std(r, axis=1, ddof=1, keepdims=True) + eps)
    return centred.reshape(n)
