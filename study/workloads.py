"""What every claims configuration shares: :class:`Run` (an experiment module, its typed config
and the fields of its smoke version) and the language-model workload (:data:`LM`,
:data:`LM_QUICK`) the LM claims and the ladder both start from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from experiments.config import Base, to_argv

__all__ = ["LM", "LM_QUICK", "Run"]


@dataclass(frozen=True)
class Run:
    """One experiment configuration the claims read: a typed ``config`` of the ``experiment``
    module (its ``run`` and ``report`` compute it); ``quick``: the fields that make its smoke
    version (``quick=True`` always)."""

    experiment: ModuleType
    config: Base
    quick: tuple[tuple[str, Any], ...] = ()
    what: str = ""

    def at(self, quick: bool) -> Base:
        """The configuration, or its smoke version."""
        return (
            dataclasses.replace(self.config, quick=True, **dict(self.quick))
            if quick
            else self.config
        )

    @property
    def command(self) -> str:
        """The equivalent command line (``python -m experiments.<name> <flags>``)."""
        name = self.experiment.__name__.rpartition(".")[2]
        return " ".join(["python -m experiments." + name, *to_argv(self.config)])


#: The language-model claims' workload (issue 23): the embedded Shakespeare (next character,
#: 64-character windows, 83 characters), ``gpt-cpu`` (8 pre-norm blocks × 64, 415k parameters)
#: at batch 16 in the pipelines and the constant-delay sweeps, 1,000 updates of warm-up +
#: cosine, 5 seeds, each arm's peak rate tuned on the first seed over a grid of 3 centred by
#: the pilots (AdamW 0.003 and Muon 0.02 trained best on one seed; an edge winner extends it)
#: and confirmed on all 5: 7 runs per arm. Equal updates, as the papers compare.
#: Budget: a pipeline run's cost is proportional to its batch (gpt-cpu, N = 8, vanilla, the
#: same machine and hour: 0.174 CPU-s per update at batch 16, 0.358 at 32), so the pipelines
#: went from batch 32 (the first sweep: ~19 CPU-hours for all six) to the constant-delay
#: sweeps' 16: 168 runs of gpt-cpu for LM1–LM6, measured at ~6.1 CPU-hours (study/README.md, "Their
#: cost, measured"; rows carry ``cpu_s``), and ``lm-deep`` (the moonshot, reported beside the
#: claims) 31 runs of twice a gpt-cpu run's cost, measured at 3.1 CPU-hours.
LM: dict[str, Any] = {"dataset": "shakespeare", "steps": 1000, "seeds": 5, "tune_seeds": 1}
#: their smoke versions: gpt-tiny, 40 updates, 2 seeds, the first seed tunes
LM_QUICK: tuple[tuple[str, Any], ...] = (
    ("steps", 40),
    ("seeds", 2),
    ("tune_seeds", 1),
    ("model", ("gpt-tiny",)),
)
