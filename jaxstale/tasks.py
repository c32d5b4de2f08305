r"""What a task measures: the metric, which way is better, its unit and its chance level.

Every experiment records, per run, the final value of the task's metric on each evaluation
split (``final_val_<metric>``, ``final_test_<metric>``) and per evaluation
(``val_<metric>``, ``test_<metric>``); selection, time to target, tables, figures, divergence
and the claims read the direction and the chance level from here, so one code path serves:

- **classification** (:func:`classification`): accuracy, higher is better, reported in %;
  chance ``1 / C`` (the score of a diverged seed in a rate selection);
- **language modelling** (:func:`language_model`): the mean next-token cross-entropy in nats
  per token, lower is better; chance ``log V``, the loss of the uniform prediction. A run whose
  final validation loss is not below ``log V`` learned nothing and counts as diverged.

A field name says its metric (its last ``_``-separated word, :func:`metric_of`), so functions
that take a field name (:func:`experiments.runs.select`, :func:`experiments.runs.time_to_accuracy`)
know the direction without another argument.

Example:
    >>> from jaxstale import tasks
    >>> t = tasks.language_model(83)
    >>> t.final("val"), t.higher_is_better, round(t.chance, 4)
    ('final_val_loss', False, 4.4188)
    >>> t.better(1.5, 1.6), t.reached(1.9, target=2.0), tasks.higher_is_better("final_val_accuracy")
    (True, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT",
    "KINDS",
    "METRICS",
    "Task",
    "classification",
    "higher_is_better",
    "language_model",
    "metric_of",
    "or_default",
    "reward",
]

#: metric -> whether higher is better
METRICS: dict[str, bool] = {"accuracy": True, "loss": False, "reward": True}

#: the task kinds
KINDS = ("classification", "language_model")


def metric_of(field: str) -> str:
    """The metric a field records: the last ``_``-separated word of its name before any ``/``
    (``"final_val_loss"`` -> ``"loss"``; ``"val_accuracy/recomputed"`` -> ``"accuracy"``).

    Raises:
        ValueError: a field of no known metric (:data:`METRICS`).
    """
    metric = field.split("/", 1)[0].rsplit("_", 1)[-1]
    if metric not in METRICS:
        raise ValueError(
            f"{field!r} records no known metric (its name must end in one of: {', '.join(METRICS)})"
        )
    return metric


def higher_is_better(field: str) -> bool:
    """Whether a larger value of ``field`` is better (accuracy) or worse (loss); a field of no
    known metric is maximised (a score of your own)."""
    metric = field.split("/", 1)[0].rsplit("_", 1)[-1]
    return METRICS.get(metric, True)


@dataclass(frozen=True)
class Task:
    """A task's metric and its reading.

    Attributes:
        kind: ``"classification"``, ``"language_model"`` or ``"reinforcement_learning"``.
        metric: ``"accuracy"``, ``"loss"`` or ``"reward"`` (the records' field suffix).
        chance: the metric of a model that learned nothing (``1 / C``; ``log V`` nats).
        scale: the factor of a table cell (100: accuracy in %; 1: nats).
        digits: decimals of a table cell.
        unit: the cells' unit, for headings (``"%"``, ``"nats"``).
    """

    kind: str
    metric: str
    chance: float
    scale: float
    digits: int
    unit: str

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric]

    @property
    def label(self) -> str:
        """The metric in words, with its unit (``"accuracy %"``, ``"loss (nats/token)"``)."""
        if self.metric == "reward":
            return "reward × 100"
        return "accuracy %" if self.metric == "accuracy" else "loss (nats/token)"

    def key(self, split: str) -> str:
        """A curve record's field: ``"<split>_<metric>"``."""
        return f"{split}_{self.metric}"

    def final(self, split: str) -> str:
        """A row's field: ``"final_<split>_<metric>"``."""
        return f"final_{split}_{self.metric}"

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly better than ``b``."""
        return a > b if self.higher_is_better else a < b

    def reached(self, value: float, target: float) -> bool:
        """Whether ``value`` reached ``target`` (at least it; at most it for a loss)."""
        return value >= target if self.higher_is_better else value <= target

    def learned(self, value: float | None) -> bool:
        """Whether a final validation value beats chance (a loss not below ``log V`` did not:
        the run counts as diverged). Accuracy below chance is a bad run, not a diverged one."""
        if value is None or not math.isfinite(value):
            return False
        return True if self.higher_is_better else value < self.chance


def classification(num_classes: int) -> Task:
    """Accuracy over ``num_classes`` classes: chance ``1 / C``, reported in %."""
    if num_classes < 1:
        raise ValueError(f"classification: num_classes must be >= 1, got {num_classes}")
    return Task("classification", "accuracy", 1.0 / num_classes, 100.0, 1, "%")


def language_model(vocab_size: int) -> Task:
    """Next-token cross-entropy over a vocabulary of ``vocab_size``: chance ``log V`` nats."""
    if vocab_size < 2:
        raise ValueError(f"language_model: vocab_size must be >= 2, got {vocab_size}")
    return Task("language_model", "loss", math.log(vocab_size), 1.0, 3, "nats")


def reward(chance: float) -> Task:
    """A verifiable reward in [0, 1] (:mod:`jaxstale.rl.tasks`): ``chance`` a uniform policy's
    expected reward, reported × 100 ("points")."""
    if not 0 <= chance <= 1:
        raise ValueError(f"reward: chance must be in [0, 1], got {chance}")
    return Task("reinforcement_learning", "reward", chance, 100.0, 1, "points")


#: how rows that name no task are read: ten-class accuracy, in % (the image experiments')
DEFAULT = classification(10)


def or_default(task: Task | None) -> Task:
    """``task``, or :data:`DEFAULT` when it is None (the one default every selection, grid
    rule and table applies).

    Example:
        >>> or_default(None).final("val"), or_default(language_model(83)).final("val")
        ('final_val_accuracy', 'final_val_loss')
    """
    return DEFAULT if task is None else task
