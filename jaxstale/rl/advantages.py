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
import numpy as np

__all__ = ["grpo_advantages"]


def grpo_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    normalize: bool = True,
    eps: float = 1e-6,
    reward_range: tuple[float, float] | None = None,
) -> jax.Array:
    """Advantages ``[n]`` of rewards ``[n]`` laid out as ``n / group_size`` consecutive groups
    of ``group_size`` responses to one prompt each.

    Example:
        >>> import jax.numpy as jnp
        >>> a = grpo_advantages(jnp.array([1.0, 0.0, 0.5, 0.5]), 2)
        >>> [round(float(x), 4) for x in a]  # (1 - 0.5) / std([1, 0]) = 0.5 / 0.7071
        [0.7071, -0.7071, 0.0, 0.0]

    ``reward_range``: the task's declared range (e.g. :attr:`Reverse.reward_range
    <jaxstale.rl.Reverse.reward_range>`); concrete rewards outside it, or not finite, are
    refused (a reward function with a bug would otherwise only shift the advantages).

    Raises:
        ValueError: a group size below 2 (no group to compare with), ``n`` not a multiple
            of it, or a reward outside ``reward_range``.
    """
    g = int(group_size)
    if g < 2:
        raise ValueError(f"grpo_advantages: group_size must be at least 2, got {group_size}")
    n = rewards.shape[0]
    if n % g:
        raise ValueError(f"grpo_advantages: {n} rewards are not groups of {g}")
    if reward_range is not None and not isinstance(rewards, jax.core.Tracer):
        lo, hi = reward_range
        v = np.asarray(jax.device_get(rewards), np.float64)
        bad = ~np.isfinite(v) | (v < lo) | (v > hi)
        if bad.any():
            raise ValueError(
                f"grpo_advantages: {int(bad.sum())} of {v.size} rewards outside the declared "
                f"range [{lo:g}, {hi:g}] (first: {v[bad][0]:g})"
            )
    r = rewards.astype(jnp.float32).reshape(n // g, g)
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    if normalize:
        centred = centred / (jnp.std(r, axis=1, ddof=1, keepdims=True) + eps)
    return centred.reshape(n)
