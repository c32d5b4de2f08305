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


def test_a_group_killed_mid_run_resumes_from_its_checkpoint(tmp_path):
    """With checkpoint_every, a group's loop.run saves under checkpoints/<group>/<code>/run-0;
    the re-run resumes it mid-run, records the same rows as an uninterrupted sweep, and the
    group's checkpoints are removed once its cells are recorded."""
    import numpy as np
    import optax

    from jaxstale import loop, train

    x, y = np.eye(2, dtype=np.float32), np.array([0, 1], np.int32)
    apply = lambda p, s, xb, train: (xb @ p, s)
    killed, starts, arm = [], [], []

    def fn(keys):
        out = []
        for k in keys:
            ex = train.executor(apply, optax.sgd(k["lr"]), x, y, np.zeros((12, 2), np.int64))

            def cb(rounds, records):
                starts.append(rounds)
                if arm and not killed and rounds == 8:
                    killed.append(rounds)
                    raise RuntimeError("killed")

            (res,) = loop.run(ex, np.zeros((2, 2), np.float32), {}, eval_every=2, callback=cb)
            out.append(({"loss": float(res.losses[-1])}, res.curve))
        return out

    keys = [{"lr": 0.5, "seed": 0}]
    plain = RunFolder("demo", {"g": 1}, out=tmp_path / "plain").run_grouped(keys, fn)
    arm.append(True)
    run = RunFolder("demo", {"g": 1}, out=tmp_path / "ck", checkpoint_every=2)
    try:
        run.run_grouped(keys, fn)
    except RuntimeError:
        pass
    (group,) = (tmp_path / "ck" / "checkpoints").iterdir()
    assert (group / run.code_hash[:16] / "run-0").is_dir()
    starts.clear()
    again = RunFolder("demo", {"g": 1}, out=tmp_path / "ck", checkpoint_every=2)
    assert again.run_grouped(keys, fn) == plain
    assert starts[0] == 10  # resumed after the checkpoint at round 8
    assert not (tmp_path / "ck" / "checkpoints").exists()
