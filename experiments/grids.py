"""Rate grids of the experiments: where a selection sits at a grid's edge and the rates that
extend it (``--extend-edges``), and the two-stage sweep (``--tune-seeds``) that runs the grid on
a few seeds and the selected rate on all of them.

Both add cells to a run folder as a function of the rows before them, so a resumed or re-run
sweep computes the same cells and writes the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jaxstale import optimizers, tasks

from . import runs
from .config import ConfigError

__all__ = [
    "EXTEND_HELP",
    "TRAINS_BY",
    "TUNE_HELP",
    "Edge",
    "confirm_selected",
    "edge_limit",
    "edge_rates",
    "edge_state",
    "extend_grid",
    "grid_seeds",
    "never_trains",
    "tune_seeds",
]


#: peak-rate grids per stage optimizer (half-decade steps, centred by the pipeline pilots):
#: constant_delay's, and sync_baseline's on a text
PEAK_LRS: dict[str, list[float]] = {
    o: [0.01, 0.03, 0.1] if o in ("sgd", "muon") else [0.001, 0.003, 0.01]
    for o in optimizers.PER_STAGE
}

#: the help of every experiment's ``extend_edges`` field
EXTEND_HELP = (
    "where the rate selected on validation is the grid's smallest or largest (and trained), "
    "run the next rate beyond it, by the grid's ratio at that end, for that method and setting "
    "only; at most this many per side (default 2; --quick 0; 0: off)"
)


def edge_limit(config: Any) -> int:
    """The resolved ``extend_edges`` of a typed config: its value, else 0 under ``--quick`` (a
    smoke run's two-rate grid always has its winner at an edge) and 2 otherwise."""
    value = getattr(config, "extend_edges", None)
    return int(value) if value is not None else (0 if getattr(config, "quick", False) else 2)


def _sig(x: float) -> float:
    return float(f"{x:.3g}")


def edge_rates(grid: Sequence[float], limit: int) -> tuple[list[float], list[float]]:
    """The rates an extension adds below and above ``grid``, outwards: ``k`` steps of the grid's
    ratio at that end (its two smallest, its two largest values), 3 significant digits; none for
    a grid of fewer than two rates. A function of the grid alone: a larger ``limit`` adds to the
    same list.

    Example:
        >>> edge_rates([0.001, 0.003, 0.01, 0.03, 0.1], 2)
        ([0.000333, 0.000111], [0.333, 1.11])
    """
    g = sorted({float(x) for x in grid})
    if len(g) < 2 or limit <= 0:
        return [], []
    seen = set(g)
    out: tuple[list[float], list[float]] = ([], [])
    for side, edge, ratio in ((out[0], g[0], g[0] / g[1]), (out[1], g[-1], g[-1] / g[-2])):
        for k in range(1, limit + 1):
            x = edge * ratio**k
            v = _sig(x) if _sig(x) not in seen else x  # rounding must not repeat a rate
            seen.add(v)
            side.append(v)
    return out


#: how far from chance a validation value must be to count as trained: 2 accuracy points, or
#: 0.05 nats below the uniform loss (a reward: 2 points above a uniform policy's)
TRAINS_BY = {"accuracy": 0.02, "loss": 0.05, "reward": 0.02}


def never_trains(rows: Sequence[dict], chance: float, task: tasks.Task | None = None) -> bool:
    """Whether no row beats ``chance`` on validation by :data:`TRAINS_BY` (diverged rows and
    rows without a value never do): a grid where nothing trained has no winner, whatever a tie
    at chance selects.

    Example:
        >>> never_trains([{"final_val_accuracy": 0.11, "diverged": False}], chance=0.1)
        True
    """
    t = tasks.or_default(task)
    field = t.final("val")
    vals = [r[field] for r in rows if not r.get("diverged") and r.get(field) is not None]
    if not vals:
        return True
    margin = TRAINS_BY[t.metric]
    if t.higher_is_better:
        return max(vals) <= chance + margin
    return min(vals) >= chance - margin


class Edge(NamedTuple):
    """Where one method × setting's selected rate sits in its grid (:func:`edge_state`):
    ``state`` ``"fixed"`` (a one-rate grid), ``"interior"``, ``"extend"`` (``rate``: the next to
    run), ``"capped"`` (``limit`` added on that side), ``"diverged"`` (every seed diverged at
    the edge), ``"untrained"`` (no rate trained: extended downwards from the smallest,
    ``rate`` None once ``limit`` were added); ``side`` −1 / +1 / 0; ``added``: the extension
    rates present, ascending."""

    state: str
    side: int
    selected: float | None
    rate: float | None
    added: tuple[float, ...]


def _val(task: tasks.Task | None) -> str:
    """The validation field a selection reads: the task's (:func:`jaxstale.tasks.or_default`)."""
    return tasks.or_default(task).final("val")


def edge_state(
    rows: Sequence[dict],
    grid: Sequence[float],
    *,
    limit: int,
    chance: float,
    knob: Any = "lr",
    task: tasks.Task | None = None,
) -> Edge:
    """The edge decision of one method × setting: ``rows`` are its cells (every rate, seed and
    secondary knob value, e.g. LC-ASGD's λ), ``grid`` its configured rates.

    The rate is selected on validation as the tables select it (:func:`experiments.runs.select`,
    diverged seeds at ``chance``, exact ties as :func:`experiments.runs.stats.best` breaks them);
    ``knob`` may be joint (``("lr", "lam")``), its first field the rate. At the smallest rate
    present the grid is extended downwards, at the largest upwards (a diverged rate above the
    selected one makes it interior), unless every seed diverged at the selected value or
    ``limit`` rates were added on that side already. Where no rate trained
    (:func:`never_trains`) the grid is extended downwards from its smallest rate: a tie at
    chance would otherwise leave the selection inside a grid that bracketed nothing. A
    function of the rows: a resume decides the same. ``task``: the metric selected on (default
    accuracy; a language model's loss, lower is better).

    Example:
        >>> rows = [{"lr": lr, "seed": 0, "final_val_accuracy": a, "diverged": False}
        ...         for lr, a in ((0.01, 0.8), (0.1, 0.9))]
        >>> edge_state(rows, [0.01, 0.1], limit=2, chance=0.1)
        Edge(state='extend', side=1, selected=0.1, rate=1.0, added=())
    """
    if len({float(x) for x in grid}) < 2 or not rows:
        return Edge("fixed", 0, None, None, ())
    sel = runs.select(rows, by=(), knob=knob, value=_val(task), chance=chance)[()]
    lr = sel if isinstance(knob, str) else sel[0]
    present = sorted({r["lr"] for r in rows})
    lo, hi = min(grid), max(grid)
    added = tuple(x for x in present if x < lo or x > hi)
    if never_trains(rows, chance, task):  # too large a rate is what stops training here
        done = sum(x < lo for x in added)
        nxt = edge_rates(grid, limit)[0][done] if done < limit else None
        return Edge("untrained", -1, present[0], nxt, added)
    side = -1 if lr == present[0] else 1 if lr == present[-1] else 0
    if side == 0:
        return Edge("interior", 0, lr, None, added)
    pick = [r for r in rows if runs.stats.knob_value(r, knob) == sel]
    if all(r.get("diverged") for r in pick):
        return Edge("diverged", side, lr, None, added)
    done = sum(x < lo for x in added) if side < 0 else sum(x > hi for x in added)
    if done >= limit:
        return Edge("capped", side, lr, None, added)
    return Edge("extend", side, lr, edge_rates(grid, limit)[side > 0][done], added)


def extend_grid(
    folder: runs.RunFolder,
    rows: Sequence[dict[str, Any]],
    compute: Callable[[list[dict[str, Any]]], Sequence[tuple[dict, list]]],
    *,
    key: Sequence[str],
    by: Sequence[str],
    grid: Sequence[float] | Callable[[tuple[Any, ...]], Sequence[float]],
    limit: int,
    chance: float,
    knob: str | Sequence[str] = "lr",
    task: tasks.Task | None = None,
) -> list[dict[str, Any]]:
    """``rows`` (a configured grid's cells, as ``run_grouped`` returned them) and the cells its
    edges add: up to ``limit`` rounds, each running :func:`edge_state`'s next rate of every
    method × setting (group of ``by``; ``grid``: its rates, or a function of the group) at
    the edge rate's seeds and secondary knob values (cell keys of the fields ``key``).

    The new rate's cells of one group form their own ``run_grouped`` group (``vary=("seed",)``;
    ``compute`` as ``run_grouped`` takes it), so groups stay a function of the configuration
    and of the rows before them; each new row carries ``"extended"``: the signed step beyond the
    grid (−1 one ratio below the smallest rate, +2 two above the largest). The extended grid
    is a function of the rows: a resume or re-run computes the same cells and the same table.

    Returns:
        ``rows`` then the added rows, round by round.
    """
    out = list(rows)
    grid_of = grid if callable(grid) else (lambda _g: grid)
    for _ in range(limit):
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in out:
            groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
        keys, steps = [], {}
        for g, per in groups.items():
            e = edge_state(per, grid_of(g), limit=limit, chance=chance, knob=knob, task=task)
            if e.rate is None:
                continue
            step = e.side * (1 + edge_rates(grid_of(g), limit)[e.side > 0].index(e.rate))
            for r in per:
                k = {f: e.rate if f == "lr" else r.get(f) for f in key}
                if r["lr"] == e.selected and k not in keys:
                    keys.append(k)
                    steps[tuple(k.values())] = step
        if not keys:
            break

        def marked(ks: list[dict[str, Any]], steps: dict = steps) -> list[tuple[dict, list]]:
            return [
                ({**row, "extended": steps[tuple(k.values())]}, m)
                for k, (row, m) in zip(ks, compute(ks), strict=True)
            ]

        out += folder.run_grouped(keys, marked, vary=("seed",), desc=f"{folder.experiment} edges")
    return out


# ----------------------------------------------------------------------------- two-stage sweeps

#: the help of every experiment's ``tune_seeds`` field
TUNE_HELP = (
    "two-stage sweep: run the rate grid (and its edge extensions) on the first K seeds only, "
    "select on their validation accuracy, then run the selected rate on every seed of --seeds; "
    "the rates are compared on the K seeds they share (default: every seed on the whole grid)"
)


def tune_seeds(config: Any, seeds: int, grids: Sequence[Sequence[float]]) -> dict[str, int]:
    """The resolved-config entry of a typed config's ``tune_seeds``: ``{}`` when unset (so run
    ids without it stay as they were), else ``{"tune_seeds": K}``.

    Raises:
      ConfigError: K above ``seeds``, or every grid has one rate (the flag would do nothing).
    """
    k = getattr(config, "tune_seeds", None)
    if k is None:
        return {}
    if k > seeds:
        raise ConfigError("tune_seeds", f"expected at most --seeds ({seeds}), got {k}")
    if all(len(set(g)) < 2 for g in grids):
        raise ConfigError(
            "tune_seeds", "selects a rate from a grid, but every rate grid here has one rate"
        )
    return {"tune_seeds": int(k)}


def grid_seeds(cfg: dict[str, Any]) -> list[int]:
    """The seeds of the rate grid: the first ``tune_seeds`` when set, else every seed."""
    return list(range(cfg.get("tune_seeds") or cfg["seeds"]))


def confirm_selected(
    folder: runs.RunFolder,
    rows: Sequence[dict[str, Any]],
    compute: Callable[[list[dict[str, Any]]], Sequence[tuple[dict, list]]],
    *,
    key: Sequence[str],
    by: Sequence[str],
    seeds: int,
    chance: float,
    knob: str | Sequence[str] = "lr",
    task: tasks.Task | None = None,
) -> list[dict[str, Any]]:
    """The second stage of a two-stage sweep: ``rows`` (the grid's cells on the tuning seeds,
    extensions included) and, for each method × setting (group of ``by``), its selected knob
    value (:func:`experiments.runs.select`: on the seeds every value shares) run at every seed
    ``0 … seeds−1`` it lacks.

    The new cells of one group form their own ``run_grouped`` group (``vary=("seed",)``); a row
    at an extended rate carries its ``"extended"`` mark. Selection over shared seeds keeps the
    choice fixed once the selected value has more seeds, so a resume computes the same cells.

    Returns:
        ``rows`` then the added rows.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    keys, marks = [], {}
    for per in groups.values():
        sel = runs.select(per, by=(), knob=knob, value=_val(task), chance=chance)[()]
        at = [r for r in per if runs.stats.knob_value(r, knob) == sel]
        have = {r["seed"] for r in at}
        for s in range(seeds):
            if s not in have:
                k = {f: s if f == "seed" else at[0].get(f) for f in key}
                keys.append(k)
                marks[tuple(k.values())] = at[0].get("extended")
    if not keys:
        return list(rows)

    def marked(ks: list[dict[str, Any]]) -> list[tuple[dict, list]]:
        out = []
        for k, (row, m) in zip(ks, compute(ks), strict=True):
            ext = marks[tuple(k.values())]
            out.append(({**row, "extended": ext} if ext is not None else row, m))
        return out

    desc = f"{folder.experiment} selected"
    return [*rows, *folder.run_grouped(keys, marked, vary=("seed",), desc=desc)]


def tuned_sweep(
    folder: runs.RunFolder,
    cells: Sequence[dict[str, Any]],
    compute: Callable[[list[dict[str, Any]]], Sequence[tuple[dict, list]]],
    cfg: dict[str, Any],
    *,
    key: Sequence[str],
    by: Sequence[str],
    chance: float,
    task: tasks.Task | None = None,
    vary: Sequence[str] = ("seed", "lr"),
) -> list[dict[str, Any]]:
    """A rate sweep's three steps on ``folder``: every cell not yet done (``run_grouped``,
    groups differing only in ``vary``), the grid extended where its winner sits at an edge
    (:func:`extend_grid`, ``cfg["lrs"]``, ``cfg["extend_edges"]``), and the selected rate run on
    every seed of ``cfg["seeds"]`` (:func:`confirm_selected`). Returns the rows."""
    rows = folder.run_grouped(list(cells), compute, vary=tuple(vary), desc=folder.experiment)
    kw = {"key": key, "by": by, "chance": chance, "task": task}
    rows = extend_grid(folder, rows, compute, grid=cfg["lrs"], limit=cfg["extend_edges"], **kw)
    return confirm_selected(folder, rows, compute, seeds=cfg["seeds"], **kw)
