r"""Tasks with a verifiable reward for a small GPT: a prompt of ids, a response of ids, and a
reward computed from the two (no learned reward model).

:class:`Reverse` asks for the prompt's ``length`` symbols in reverse order. A sequence is laid
out as ``prompt ‖ SEP ‖ response`` (``2·length + 1`` ids over ``symbols + 1`` ids, ``SEP`` the
last); a policy reads the ``2·length`` ids before the last and predicts each response id from
everything before it. The reward is the fraction of response positions that are right,

.. math::

    R(p, y) = \frac{1}{L} \sum_{t=1}^{L} \mathbf 1[y_t = p_{L + 1 - t}] \in [0, 1],

so a uniform policy over the symbols scores ``1 / symbols`` in expectation (``1 / (symbols +
1)`` over the whole vocabulary, the separator included) and a correct one 1 (per-character
partial credit keeps the signal dense for group-relative advantages). :meth:`Reverse.targets`
gives the correct responses, for a supervised start.

References:
    Zaremba & Sutskever, "Learning to Execute", arXiv 1410.4615 (2014): copy, reverse and
    addition as algorithmic sequence tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxstale._checks import check_int

__all__ = ["Reverse"]


@dataclass(frozen=True)
class Reverse:
    """Reverse ``length`` symbols drawn uniformly from ``symbols`` (ids ``0 … symbols − 1``;
    ``SEP = symbols``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> task = Reverse(length=3, symbols=4)
        >>> p = jnp.array([[0, 1, 2]])
        >>> task.sequence(p, task.targets(p)).tolist()
        [[0, 1, 2, 4, 2, 1, 0]]
        >>> [round(x, 4) for x in task.reward(p, jnp.array([[2, 1, 3]])).tolist()]  # 2 of 3
        [0.6667]
    """

    length: int = 6
    symbols: int = 8

    def __post_init__(self) -> None:
        check_int(self.length, "length", "Reverse", minimum=1)
        check_int(self.symbols, "symbols", "Reverse", minimum=2)

    @property
    def vocab(self) -> int:
        """Ids the policy reads and writes: the symbols and the separator."""
        return self.symbols + 1

    @property
    def sep(self) -> int:
        return self.symbols

    @property
    def context(self) -> int:
        """The policy's input length: the sequence without its last id."""
        return 2 * self.length

    #: the reward's declared range
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def prompts(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` prompts ``[n, length]`` (int32), drawn from ``key``."""
        check_int(n, "n", "Reverse.prompts", minimum=1)
        return jax.random.randint(key, (n, self.length), 0, self.symbols, jnp.int32)

    def targets(self, prompts: jax.Array) -> jax.Array:
        """The correct responses: each prompt reversed."""
        return prompts[:, ::-1]

    def sequence(self, prompts: jax.Array, responses: jax.Array) -> jax.Array:
        """``prompt ‖ SEP ‖ response``, ``[n, 2·length + 1]``."""
        sep = jnp.full((prompts.shape[0], 1), self.sep, prompts.dtype)
        return jnp.concatenate([prompts, sep, responses.astype(prompts.dtype)], axis=1)

    def reward(self, prompts: jax.Array, responses: jax.Array) -> jax.Array:
        """The fraction of response ids that are right, ``[n]`` in ``[0, 1]`` (float32).

        Raises:
            ValueError: prompts and responses of different shapes.
        """
        if prompts.shape != responses.shape:
            raise ValueError(
                f"reward: responses {tuple(responses.shape)} for prompts {tuple(prompts.shape)}"
            )
        return jnp.mean(responses == self.targets(prompts), axis=1, dtype=jnp.float32)
