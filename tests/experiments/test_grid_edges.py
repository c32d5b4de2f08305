"""A rate grid whose winner sits at an edge is extended (issue 22): the decision on hand-made rows
(``experiments.grids.edge_state``), the extension loop on a run folder with a synthetic cell
function (``extend_grid``: its groups, its ``extended`` marks, a resume), what the table says
(``experiments.reports.edge_notes``), and a tiny sync_baseline sweep end to end."""

import json

import pytest

from experiments import runs, sync_baseline
from experiments.grids import edge_limit, edge_rates, edge_state, extend_grid
from experiments.reports import ALL_DIVERGED, NOT_EXTENDED, edge_notes, tuned_tables
from experiments.runs.groups import TIMING_FIELDS

GRID = [0.01, 0.03, 0.1]


def _rows(scores, seeds=2, **fields):
    """Rows of one method × setting: ``scores`` maps a rate to its validation accuracy (None:
    every seed diverged)."""
    return [
        {**fields, "lr": lr, "seed": s, "final_val_accuracy": a, "diverged": a is None}
        for lr, a in scores.items()
        for s in range(seeds)
    ]


def test_edge_rates_follow_the_grid_ratio_at_each_end():
    assert edge_rates(GRID, 2) == ([0.00333, 0.00111], [0.333, 1.11])
    assert edge_rates([0.001, 0.003, 0.01, 0.03, 0.1], 1) == ([0.000333], [0.333])
    assert edge_rates([0.1, 0.01], 1) == ([0.001], [1.0])  # unsorted grid: by value
    assert edge_rates([0.02], 2) == ([], []) and edge_rates(GRID, 0) == ([], [])
    assert edge_rates(GRID, 1)[1] == edge_rates(GRID, 3)[1][:1]  # a function of the grid


def test_lower_edge_extends_downwards():
    e = edge_state(_rows({0.01: 0.9, 0.03: 0.8, 0.1: 0.5}), GRID, limit=2, chance=0.1)
    assert (e.state, e.side, e.selected, e.rate, e.added) == ("extend", -1, 0.01, 0.00333, ())


def test_upper_edge_extends_upwards():
    e = edge_state(_rows({0.01: 0.5, 0.03: 0.8, 0.1: 0.9}), GRID, limit=2, chance=0.1)
    assert (e.state, e.side, e.rate) == ("extend", 1, 0.333)


def test_interior_optimum_is_left_alone():
    e = edge_state(_rows({0.01: 0.5, 0.03: 0.9, 0.1: 0.8}), GRID, limit=2, chance=0.1)
    assert (e.state, e.side, e.rate) == ("interior", 0, None)


def test_a_diverged_neighbour_above_makes_the_edge_interior():
    rows = _rows({0.01: 0.5, 0.03: 0.8, 0.1: 0.9, 0.333: None})
    e = edge_state(rows, GRID, limit=2, chance=0.1)
    assert (e.state, e.selected, e.added) == ("interior", 0.1, (0.333,))


def test_a_grid_where_nothing_trained_is_extended_downwards_until_the_cap():
    """Every seed diverged, or every rate at chance: a tie at chance would select a rate inside
    a grid that brackets nothing, so the grid goes down from its smallest rate."""
    down = edge_rates(GRID, 2)[0]
    e = edge_state(_rows({0.01: None, 0.03: None, 0.1: None}), GRID, limit=2, chance=0.1)
    assert (e.state, e.side, e.selected, e.rate) == ("untrained", -1, 0.01, down[0])
    flat = _rows({0.01: 0.105, 0.03: 0.11, 0.1: 0.1, down[0]: 0.1, down[1]: 0.11})
    e = edge_state(flat, GRID, limit=2, chance=0.1)
    assert (e.state, e.rate, e.added) == ("untrained", None, tuple(sorted(down)))
    notes = edge_notes(flat, by=(), grid=GRID, limit=2, chance_acc=0.1)
    assert "**no rate trained** (every rate at chance on validation" in notes
    # one rate that trains (3 points above chance) makes it an ordinary selection
    assert edge_state(
        _rows({0.01: 0.13, 0.03: 0.1, 0.1: 0.1}), GRID, limit=2, chance=0.1
    ).state == ("extend")


def test_the_cap_stops_the_extension_and_says_so():
    rows = _rows({0.00111: 0.95, 0.00333: 0.9, 0.01: 0.85, 0.03: 0.8, 0.1: 0.5})
    e = edge_state(rows, GRID, limit=2, chance=0.1)
    assert (e.state, e.side, e.selected, e.added) == ("capped", -1, 0.00111, (0.00111, 0.00333))
    assert edge_state(rows[:-4], GRID, limit=3, chance=0.1).rate == edge_rates(GRID, 3)[0][2]
    off = edge_state(_rows({0.01: 0.9, 0.03: 0.8, 0.1: 0.5}), GRID, limit=0, chance=0.1)
    assert off.state == "capped"  # --extend-edges 0: at the edge, reported, not extended


def test_one_rate_grid_and_joint_knob():
    assert edge_state(_rows({0.02: 0.9}), [0.02], limit=2, chance=0.1).state == "fixed"
    # LC-ASGD: (lr, λ) tuned jointly; the edge is the rate's
    rows = _rows({0.01: 0.5, 0.1: 0.7}, lam=-0.1) + _rows({0.01: 0.6, 0.1: 0.9}, lam=0.1)
    e = edge_state(rows, [0.01, 0.1], limit=1, chance=0.1, knob=("lr", "lam"))
    assert (e.state, e.selected, e.rate) == ("extend", 0.1, 1.0)
    rows += [{**r, "extended": 1} for r in _rows({1.0: 0.8}, lam=-0.1) + _rows({1.0: 0.8}, lam=0.1)]
    notes = edge_notes(rows, by=(), grid=[0.01, 0.1], limit=1, chance_acc=0.1, knob=("lr", "lam"))
    assert notes.endswith("- grid extended: : lr 1 (80.0) added (the selection was at the edge); "
                          "selected 0.1, now interior.")  # fmt: skip


def test_edge_limit_defaults():
    assert edge_limit(sync_baseline.Config()) == 2
    assert edge_limit(sync_baseline.Config(quick=True)) == 0
    assert edge_limit(sync_baseline.Config(quick=True, extend_edges=1)) == 1
    assert sync_baseline.Config().resolved()["extend_edges"] == 2  # part of the run id


# ----------------------------------------------------------------------------- extend_grid


def _peak(lr, method):
    """A synthetic validation accuracy: ``a`` and ``b`` peak at 3.0 (beyond the cap above the
    grid), ``c`` at 1e-6 (beyond the cap below), ``d`` at 0.03 (inside); ``b`` diverges above
    0.2."""
    import math

    best = {"a": 3.0, "b": 3.0, "c": 1e-6, "d": 0.03}[method]
    return max(0.1, 0.95 - 0.1 * abs(math.log10(lr / best)))


def _sweep(folder, calls, limit=2):
    key = ("method", "lr", "seed")

    def compute(ks):
        calls.append([(k["method"], k["lr"], k["seed"]) for k in ks])
        out = []
        for k in ks:
            div = k["method"] == "b" and k["lr"] > 0.2
            acc = None if div else _peak(k["lr"], k["method"]) + 0.001 * k["seed"]
            out.append(({"final_val_accuracy": acc, "diverged": div}, [{"step": 1}]))
        return out

    keys = [{"method": m, "lr": lr, "seed": s} for m in "abcd" for lr in GRID for s in (0, 1)]
    rows = folder.run_grouped(keys, compute, vary=("seed", "lr"))
    return extend_grid(
        folder, rows, compute, key=key, by=("method",), grid=GRID, limit=limit, chance=0.1
    )


def test_extend_grid_adds_cells_per_method_in_their_own_groups_and_resumes(tmp_path):
    calls = []
    folder = runs.RunFolder("edges", {"grid": GRID}, tmp_path / "run", code={"x": 1})
    rows = _sweep(folder, calls)
    added = {(r["method"], r["lr"], r["extended"]) for r in rows if "extended" in r}
    # a: the top edge twice (capped); b: 0.333 diverges, so 0.1 is interior; c: the bottom
    # edge twice (capped); d: interior from the start
    assert added == {
        ("a", 0.333, 1), ("a", 1.11, 2), ("b", 0.333, 1), ("c", 0.00333, -1), ("c", 0.00111, -2)
    }  # fmt: skip
    assert calls[4:] == [  # 4 grid groups, then one group per new rate, round by round
        [("a", 0.333, 0), ("a", 0.333, 1)],
        [("b", 0.333, 0), ("b", 0.333, 1)],
        [("c", 0.00333, 0), ("c", 0.00333, 1)],
        [("a", 1.11, 0), ("a", 1.11, 1)],
        [("c", 0.00111, 0), ("c", 0.00111, 1)],
    ]
    assert all("extended" not in r for r in rows[:24])  # the grid's cells are unchanged
    notes = edge_notes(rows, by=("method",), grid=GRID, limit=2, chance_acc=0.1)
    assert "- grid extended: method a: lr 0.333 (85.5), 1.11 (90.7) added (the selection" in notes
    assert "selected 1.11, **still at the edge after 2 extensions** (the grid's largest" in notes
    assert "method b: lr 0.333 (10.0 [2/2 div.]) added (the selection was at the edge); " in notes
    assert "selected 0.1, now interior." in notes
    assert "method c: lr 0.00111 (64.6), 0.00333 (59.8) added" in notes
    assert "the grid's smallest; the optimum may lie beyond)." in notes
    assert "method d" not in notes

    # a resume recomputes only the group of a deleted extension cell, to the same rows
    victim = next(r for r in rows if r.get("extended") == -2 and r["seed"] == 1)
    folder._cell_path({k: victim[k] for k in ("method", "lr", "seed")}).unlink()
    again = runs.RunFolder("edges", {"grid": GRID}, tmp_path / "run", code={"x": 1})
    calls.clear()
    assert _sweep(again, calls) == rows
    assert calls == [[("c", 0.00111, 0), ("c", 0.00111, 1)]]


def test_extension_off_and_tables_put_added_rates_in_their_place(tmp_path):
    calls = []
    folder = runs.RunFolder("edges", {"grid": GRID}, tmp_path / "off", code={"x": 1})
    rows = _sweep(folder, calls, limit=0)
    assert len(rows) == 24 and len(calls) == 4
    notes = edge_notes(rows, by=("method",), grid=GRID, limit=0, chance_acc=0.1)
    assert "- at the edge, not extended (--extend-edges 0): method a: selected 0.1" in notes
    rows = _sweep(runs.RunFolder("e", {}, tmp_path / "on", code={}), calls, limit=1)
    *_, grid, _ = tuned_tables(rows, index=("method",), columns=None, chance_acc=0.1)
    head = grid.splitlines()[0]
    assert head.index("lr 0.00333") < head.index("lr 0.01") < head.index("lr 0.333")
    one = edge_notes(rows[:2], by=("method",), grid=[0.01], limit=2, chance_acc=0.1)
    assert one == ""  # a one-rate grid: nothing to say


# ----------------------------------------------------------------------------- end to end


def _bytes(folder):
    rows = json.loads((folder / "summary.json").read_text())["rows"]
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows], (
        folder / "table.md"
    ).read_bytes()


@pytest.mark.slow  # 10 s: a sweep; the folder-level extension tests above stay in make test
def test_sync_baseline_extends_its_edge_and_resumes_to_the_same_table(tmp_path):
    """Two rates far below the optimum on 30 steps: the larger wins, the grid grows upwards by
    its ratio, the table says so, and a resume after deleting an extended cell writes the
    same table byte for byte."""
    out = tmp_path / "run"
    argv = ["--model", "mlp", "--steps", "30", "--eval-every", "10", "--seeds", "2"]
    argv += ["--lrs", "0.0001,0.0003", "--extend-edges", "1", "--out", str(out)]
    res = sync_baseline.main(argv)
    ext = [r for r in res["rows"] if r.get("extended")]
    assert {(r["lr"], r["extended"], r["seed"]) for r in ext} == {(0.0009, 1, 0), (0.0009, 1, 1)}
    assert json.loads((out / "config.json").read_text())["config"]["extend_edges"] == 1
    table = res["table"]
    assert "**Grid edges** (--extend-edges 1" in table
    assert "- grid extended: model mlp: lr 0.0009 (" in table
    assert "**still at the edge after 1 extension** (the grid's largest" in table
    assert "| lr 0.0001 | lr 0.0003 | lr 0.0009 |" in table
    rows, text = _bytes(out)
    cell = next(p for p in (out / "cells").glob("*.json") if '"extended": 1' in p.read_text())
    cell.unlink()
    sync_baseline.main(argv)
    assert _bytes(out) == (rows, text)


@pytest.mark.slow  # long (19 s): two sweeps
def test_async_workers_and_pipeline_extend_per_setting(tmp_path):
    """async_workers: LC-ASGD's λ tuned with the rate, so an extension runs the new rate at
    every λ; the rate grid per momentum. pipeline_staleness: per (model, policy, N)."""
    from experiments import async_workers, pipeline_staleness

    argv = ["--steps", "24", "--seeds", "1", "--workers", "4", "--batch-size", "16"]
    argv += ["--lrs", "0.0001,0.0003", "--extend-edges", "1", "--methods", "lc-asgd"]
    res = async_workers.main([*argv, "--lc-lambdas=-0.1,0.1", "--out", str(tmp_path / "a")])
    ext = {(r["lr"], r["lam"], r["extended"]) for r in res["rows"] if r.get("extended")}
    assert ext == {(0.0009, -0.1, 1), (0.0009, 0.1, 1)}
    assert "- grid extended: method lc-asgd, workers 4, momentum 0.9: lr 0.0009 (" in res["table"]
    argv = ["--model", "mlp", "--stages", "2", "--seeds", "1", "--steps", "16"]
    argv += ["--lrs", "0.003,0.01", "--extend-edges", "1", "--methods", "vanilla"]
    res = pipeline_staleness.main([*argv, "--out", str(tmp_path / "p")])
    ext = {(r["method"], r["stages"], r["lr"]) for r in res["rows"] if r.get("extended")}
    assert ext in ({("vanilla", 2, 0.001)}, {("vanilla", 2, 0.0333)})  # two rates: an edge wins
    lr = next(iter(ext))[2]
    assert f"- grid extended: model mlp, method vanilla, stages 2: lr {lr:g} (" in res["table"]


def test_an_edge_where_every_seed_diverged_is_not_extended_and_says_so():
    """Some seed trained somewhere (so the grid trains), yet the selected edge rate diverged on
    every seed: a trained-but-below-chance mean at 0.01 (0.13 and 0.05) loses to the diverged
    0.1 (at chance). The rule does not extend past a rate that diverged."""
    rows = [
        {"lr": 0.01, "seed": 0, "final_val_accuracy": 0.13, "diverged": False},
        {"lr": 0.01, "seed": 1, "final_val_accuracy": 0.05, "diverged": False},
    ] + [{"lr": 0.1, "seed": s, "final_val_accuracy": None, "diverged": True} for s in (0, 1)]
    e = edge_state(rows, [0.01, 0.1], limit=2, chance=0.1)
    assert (e.state, e.side, e.selected, e.rate) == ("diverged", 1, 0.1, None)
    notes = edge_notes(rows, by=(), grid=[0.01, 0.1], limit=2, chance_acc=0.1)
    assert notes.endswith(f"- {NOT_EXTENDED}: : selected 0.1, the grid's largest, {ALL_DIVERGED}.")
