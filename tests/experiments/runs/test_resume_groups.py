"""A resumed sweep recomputes a missing cell in its fresh run's group, so its table is the same
bytes, even where a cell's numbers depend on the company it is computed in (as XLA's may on the
lanes of a vmap); recomputed finished cells are checked against their files."""

import json

from experiments.runs import RunFolder, markdown_table

KEYS = [{"lr": lr, "seed": s} for lr in (0.1, 0.3) for s in range(3)]


def _lane_dependent(keys):
    """A group of cells whose numbers depend on the whole group (like a vmapped reduction whose
    order depends on the lane count): computed alone, a cell would come out otherwise."""
    company = sum(k["seed"] for k in keys) + len(keys)
    return [
        ({"acc": round(0.5 + k["lr"] / 7 + company / 1000, 6), "wall_s": 0.1 * len(keys)},
         [{"step": 1, "loss": 1.0 / (1 + company)}])
        for k in keys
    ]  # fmt: skip


def _sweep(path, fn=_lane_dependent):
    run = RunFolder("demo", {"grid": "g"}, out=path)
    rows = run.run_grouped(KEYS, fn, vary=("seed",))
    table = markdown_table(["lr", "seed", "acc"], [[r["lr"], r["seed"], r["acc"]] for r in rows])
    run.finish(table)
    return run


def test_resume_after_a_lost_or_damaged_cell_writes_the_same_table(tmp_path):
    fresh = _sweep(tmp_path / "fresh")
    table = (fresh.path / "table.md").read_bytes()
    cells = sorted((fresh.path / "cells").glob("*.json"))
    assert len(cells) == len(KEYS)
    cells[1].unlink()  # lost
    cells[4].write_text(cells[4].read_text()[:40])  # damaged: cut mid-write
    calls = []

    def spy(keys):
        calls.append([(k["lr"], k["seed"]) for k in keys])
        return _lane_dependent(keys)

    again = _sweep(tmp_path / "fresh", spy)
    assert (again.path / "table.md").read_bytes() == table
    assert [len(c) for c in calls] == [3, 3]  # both groups in full, as in the fresh run
    assert again.disagreements == []  # wall_s differs (timing) and is not compared


def test_a_finished_cell_that_disagrees_is_reported_and_kept(tmp_path, capsys):
    run = _sweep(tmp_path / "r")
    key = {"lr": 0.1, "seed": 2}
    path = run._cell_path(key)
    cell = json.loads(path.read_text())
    cell["row"]["acc"] = 0.25  # not what the code computes
    path.write_text(json.dumps(cell))
    run._cell_path({"lr": 0.1, "seed": 0}).unlink()
    capsys.readouterr()
    again = _sweep(tmp_path / "r")
    err = capsys.readouterr().err
    assert "5/6 cells already done; 2 recomputed with their groups and checked" in err
    assert len(again.disagreements) == 1 and again.disagreements[0].startswith('{"lr": 0.1')
    assert "acc 0.25 → " in again.disagreements[0]
    assert "warning: a finished cell recomputed with its group differs" in err
    assert again.done(key)["acc"] == 0.25  # the file is kept


def test_complete_groups_are_not_recomputed(tmp_path):
    run = _sweep(tmp_path / "r")
    run._cell_path({"lr": 0.3, "seed": 0}).unlink()
    calls = []
    RunFolder("demo", {"grid": "g"}, out=tmp_path / "r").run_grouped(
        KEYS, lambda ks: calls.append(ks) or _lane_dependent(ks), vary=("seed",)
    )
    assert [[(k["lr"], k["seed"]) for k in ks] for ks in calls] == [[(0.3, 0), (0.3, 1), (0.3, 2)]]
