"""Two-stage sweeps (``--tune-seeds``, ``experiments.grids.confirm_selected``): the rate grid
on K seeds, selection on their validation accuracy, then the selected rate on every seed; the
selection compares rates on the seeds they share, so the added seeds never change it; every
cell is the cell a full-grid run computes."""

import json

import pytest

from experiments import async_workers, pipeline_staleness, reports, runs, sync_baseline
from experiments.config import ConfigError
from experiments.grids import confirm_selected, extend_grid, grid_seeds
from experiments.runs.groups import TIMING_FIELDS
from jaxstale import tasks

GRID = [0.01, 0.03, 0.1]


def _val(method, lr, seed):
    """``a`` peaks at 0.03 on the tuning seed 0 and is worse there on later seeds; ``b`` peaks at
    the grid's top (an edge) and diverges above 0.2."""
    if method == "b":
        return None if lr > 0.2 else 0.5 + lr
    return {0.01: 0.80, 0.03: 0.90, 0.1: 0.85}[lr] - (0.2 if lr == 0.03 and seed else 0.0)


def _sweep(folder, calls, seeds=3):
    key = ("method", "lr", "seed")

    def compute(ks):
        calls.append([(k["method"], k["lr"], k["seed"]) for k in ks])
        out = []
        for k in ks:
            acc = _val(k["method"], k["lr"], k["seed"])
            out.append(({"final_val_accuracy": acc, "diverged": acc is None}, [{"step": 1}]))
        return out

    keys = [{"method": m, "lr": lr, "seed": 0} for m in "ab" for lr in GRID]
    rows = folder.run_grouped(keys, compute, vary=("lr",))
    kw = {"key": key, "by": ("method",), "chance": 0.1}
    rows = extend_grid(folder, rows, compute, grid=GRID, limit=1, **kw)
    return confirm_selected(folder, rows, compute, seeds=seeds, **kw)


def test_the_selected_rate_runs_every_seed_and_stays_selected(tmp_path):
    calls = []
    folder = runs.RunFolder("tune", {"grid": GRID}, tmp_path / "run", code={"x": 1})
    rows = _sweep(folder, calls)
    # a: 0.03 wins on seed 0; b: the edge 0.1 extends to 0.333 (diverges), 0.1 stays selected
    assert calls[2:] == [
        [("b", 0.333, 0)],
        [("a", 0.03, 1), ("a", 0.03, 2)],
        [("b", 0.1, 1), ("b", 0.1, 2)],
    ]
    # over all its seeds 0.03 is worse than 0.1 (0.77 < 0.85), yet the shared seed decides
    assert runs.select(rows, by=("method",), chance=0.1) == {("a",): 0.03, ("b",): 0.1}
    assert all("extended" not in r for r in rows if r["method"] == "a")
    # a resume recomputes only the group of a deleted second-stage cell, to the same rows
    folder._cell_path({"method": "a", "lr": 0.03, "seed": 2}).unlink()
    again = runs.RunFolder("tune", {"grid": GRID}, tmp_path / "run", code={"x": 1})
    calls.clear()
    assert _sweep(again, calls) == rows
    assert calls == [[("a", 0.03, 1), ("a", 0.03, 2)]]


def test_an_extended_selection_carries_its_mark_to_the_new_seeds(tmp_path):
    calls = []
    grid = [0.003, 0.01]  # a peaks at 0.0333: the top edge extends to it, and it wins
    folder = runs.RunFolder("tune", {"grid": grid}, tmp_path / "run", code={"x": 1})

    def compute(ks):
        calls.append(len(ks))
        vals = {0.003: 0.7, 0.01: 0.8, 0.0333: 0.9, 0.111: 0.85}
        return [({"final_val_accuracy": vals[k["lr"]], "diverged": False}, []) for k in ks]

    kw = {"key": ("method", "lr", "seed"), "by": ("method",), "chance": 0.1}
    rows = folder.run_grouped([{"method": "a", "lr": x, "seed": 0} for x in grid], compute)
    rows = extend_grid(folder, rows, compute, grid=grid, limit=2, **kw)
    rows = confirm_selected(folder, rows, compute, seeds=2, **kw)
    assert [(r["lr"], r["seed"], r.get("extended")) for r in rows[2:]] == [
        (0.0333, 0, 1), (0.111, 0, 2), (0.0333, 1, 1)
    ]  # fmt: skip
    assert calls == [1, 1, 1, 1, 1]  # two grid cells, two extensions, one new seed


def test_shared_seeds_and_best():
    per = {0.1: [{"seed": s, "v": 0.5} for s in range(3)], 0.3: [{"seed": 0, "v": 0.6}]}
    assert runs.stats.best(per, "v") == 0.3
    assert runs.stats.best({1: [{"seed": 0, "v": 0.2}], 2: [{"seed": 1, "v": 0.1}]}, "v") == 1
    with pytest.raises(ValueError, match="test"):
        runs.stats.best(per, "final_test_accuracy")


def test_config_checks_and_run_ids():
    assert "tune_seeds" not in sync_baseline.Config().resolved()  # run ids without it unchanged
    assert grid_seeds(sync_baseline.Config(seeds=5, tune_seeds=2).resolved()) == [0, 1]
    assert grid_seeds(sync_baseline.Config(seeds=5).resolved()) == list(range(5))
    with pytest.raises(ConfigError, match=r"tune_seeds: expected at most --seeds \(3\), got 4"):
        sync_baseline.Config(seeds=3, tune_seeds=4).resolved()
    with pytest.raises(ConfigError, match="every rate grid here has one rate"):
        pipeline_staleness.Config(lrs=(0.01,), tune_seeds=1).resolved()
    with pytest.raises(ConfigError, match="tune_seeds"):
        sync_baseline.Config(tune_seeds=0)
    # LC-ASGD's λ grid is tuned too: one rate with two λ values is a grid
    lc = async_workers.Config(lrs=(0.01,), methods=("lc-asgd",), lc_lambdas=(-0.1, 0.1))
    assert async_workers.Config(**{**lc.__dict__, "tune_seeds": 1}).resolved()["tune_seeds"] == 1


def _rows(folder):
    rows = json.loads((folder / "summary.json").read_text())["rows"]
    return {
        (r["lr"], r["seed"]): {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows
    }


@pytest.mark.slow  # 10 s: a sweep; the folder-level two-stage tests above stay in make test
def test_sync_baseline_two_stage_cells_are_those_of_a_one_rate_run(tmp_path, capsys):
    argv = ["--model", "mlp", "--steps", "30", "--eval-every", "10", "--seeds", "3"]
    argv += ["--lrs", "0.01,0.1", "--extend-edges", "0"]
    res = sync_baseline.main([*argv, "--tune-seeds", "1", "--out", str(tmp_path / "two")])
    two = _rows(tmp_path / "two")
    (lr,) = {lr for lr, s in two if s == 2}
    assert sorted(two) == sorted([(x, 0) for x in (0.01, 0.1)] + [(lr, 1), (lr, 2)])
    assert "**Two-stage sweep** (--tune-seeds 1): each rate grid" in res["table"]
    assert "ran on seed 0, and the rate was selected" in res["table"]
    one = [*argv[:-4], "--lrs", f"{lr:g}", "--extend-edges", "0", "--out", str(tmp_path / "one")]
    sync_baseline.main(one)  # the selected rate alone, every seed in one group
    assert {k: two[k] for k in two if k[0] == lr} == _rows(tmp_path / "one")  # bit for bit
    capsys.readouterr()


@pytest.mark.slow  # long: two sweeps
def test_async_workers_and_pipeline_two_stage(tmp_path):
    argv = ["--steps", "24", "--seeds", "3", "--workers", "4", "--batch-size", "16"]
    argv += ["--lrs", "0.003,0.03", "--extend-edges", "0", "--methods", "asgd,lc-asgd"]
    argv += ["--lc-lambdas=-0.1,0.1", "--tune-seeds", "1"]
    res = async_workers.main([*argv, "--out", str(tmp_path / "a")])
    for m in ("asgd", "lc-asgd"):
        mine = [r for r in res["rows"] if r["method"] == m]
        top = {(r["lr"], r["lam"]) for r in mine if r["seed"] == 2}
        assert len(top) == 1 and len(mine) == (2 if m == "asgd" else 4) + 2
    argv = ["--model", "mlp", "--stages", "2", "--seeds", "3", "--steps", "16", "--lrs"]
    argv += ["0.003,0.01", "--extend-edges", "0", "--methods", "vanilla", "--tune-seeds", "2"]
    res = pipeline_staleness.main([*argv, "--out", str(tmp_path / "p")])
    (lr,) = {r["lr"] for r in res["rows"] if r["seed"] == 2}
    assert sorted((r["lr"], r["seed"]) for r in res["rows"]) == sorted(
        [(0.003, 0), (0.003, 1), (0.01, 0), (0.01, 1), (lr, 2)]
    )
    assert "**Two-stage sweep** (--tune-seeds 2)" in res["table"]


def test_tuning_note_names_the_tasks_selection_metric():
    cfg = {"tune_seeds": 2, "seeds": 5}
    assert "selected on their validation accuracy (" in reports.tuning_note(cfg)
    lm = reports.tuning_note(cfg, tasks.language_model(65))
    assert "ran on seeds 0–1, and the rate was selected on their validation loss (" in lm
    assert "ran on all 5 seeds" in lm and reports.tuning_note({"seeds": 5}) == ""
