"""The language-model ladder's rungs (issue 52): which run a pipeline claim's verdict reads.

The LM claims were declared on 1,000 updates (1.02 M characters, 2.5 tokens per parameter of
``gpt-cpu``: early training, the n-gram regime). The ladder re-measures the same declared
primaries at 4,000 updates (:data:`study.configs_modern.LADDER_RUNS`). A claim with a rung
(:data:`RUNG`) is read at it once its run has finished, its 1k primary kept in the evidence as
the early-training rung (:func:`early_line`); the headline's regime column and the caveat name
the run read (:func:`run_read`). Whether the synchronous reference converged at a rung is the
Budget section's rule for a language model (:mod:`study.budget`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import Claim, Context
    from .verdicts import Diff

__all__ = ["RUNG", "early_line", "run_read"]

#: a claim's rung of record above 1k updates: the run that measures its declared primary at
#: 4k updates (the same policies at N = 8, optimizer and batch; the ladder's rate grid)
RUNG: dict[str, str] = {
    "LM2": "lm-ladder-4k-asyncpp",
    "LM3": "lm-ladder-4k",
    "LM6": "lm-ladder-4k",
}


def run_read(ctx: Context, claim: Claim) -> str:
    """The run whose rows a claim's verdict reads: its rung where that run finished, else its
    first run."""
    rung = RUNG.get(claim.id)
    return rung if rung is not None and ctx.has(rung) else claim.runs[0]


def early_line(rung: str, regime: str, early: Diff | None) -> list[str]:
    """The evidence line of a claim read at ``rung`` (``regime``: its
    :func:`study.language.regime`), with the primary ``early`` on the 1k rows where it was
    measured (the early-training rung: shown, not in the verdict)."""
    where = regime.removeprefix("regime: ")
    line = f"- read at the `{rung}` rung" + (f" ({where})" if where else "")
    if early is not None:
        line += f"; the early-training rung, 1k updates (not in the verdict): {early.text()}"
    return [line]
