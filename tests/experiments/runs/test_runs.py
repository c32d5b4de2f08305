"""Run folders: atomic files, resume, summary schema, NaN as null, tables, CLI."""

import json
import math
import os
import time

import numpy as np
import pytest

from experiments import runs
from experiments.runs import RunFolder


def _keys():
    return [
        {"model": m, "lr": lr, "seed": s}
        for m in ("mlp", "cnn")
        for lr in (0.1, 0.03)
        for s in range(2)
    ]


def _cell(key):
    acc = float("nan") if key["lr"] == 0.1 and key["model"] == "cnn" else 0.5 + key["seed"] / 10
    return {"final_test_accuracy": acc, "diverged": not math.isfinite(acc)}, [
        {"step": i, "train_loss": 1.0 / (i + 1)} for i in range(3)
    ]


def test_folder_layout_and_run_id(tmp_path):
    cfg = {"steps": 10, "lrs": [0.1, 0.03]}
    a = RunFolder("exp", cfg, root=tmp_path)
    b = RunFolder("exp", dict(reversed(list(cfg.items()))), root=tmp_path)
    assert a.path == b.path == tmp_path / "exp" / a.run_id
    assert len(a.run_id) == 10 and all(c in "0123456789abcdef" for c in a.run_id)
    assert RunFolder("exp", {**cfg, "steps": 11}, root=tmp_path).run_id != a.run_id
    assert RunFolder("other", cfg, root=tmp_path).run_id == a.run_id  # name-free hash
    assert not (tmp_path / "exp").exists()  # created on the first record, not before
    assert a.create() == a.path and (a.path / "cells").is_dir()
    stored = json.loads((a.path / "config.json").read_text())
    assert stored == {
        "experiment": "exp",
        "run_id": a.run_id,
        "config": cfg,
        "code": {**runs.code_fingerprint(), "hash": a.code_hash},
    }
    out = RunFolder("exp", cfg, out=tmp_path / "mine")
    assert out.path == tmp_path / "mine" and not out.path.exists()
    out.record({"seed": 0}, {"final_test_accuracy": 0.5})
    assert (out.path / "config.json").exists()


def test_out_with_different_config_is_refused(tmp_path):
    RunFolder("exp", {"a": 1}, out=tmp_path / "o").create()
    with pytest.raises(runs.RunFolderError, match="different config"):
        RunFolder("exp", {"a": 2}, out=tmp_path / "o")
    with pytest.raises(ValueError, match="experiment"):
        RunFolder("a/b", {}, root=tmp_path)


def test_resume_skips_finished_cells(tmp_path, capsys):
    calls = []

    def fn(key):
        calls.append(key)
        if len(calls) == 5:
            raise KeyboardInterrupt  # interrupted mid-sweep
        return _cell(key)

    run = RunFolder("exp", {"x": 1}, root=tmp_path)
    with pytest.raises(SystemExit) as exit_info:  # Ctrl-C: one line, status 130
        run.run(_keys(), fn)
    assert exit_info.value.code == 130
    assert f"interrupted: 4 cells saved in {run.path}; re-run" in capsys.readouterr().err
    assert len(calls) == 5 and len(run.rows()) == 4
    lines_before = (run.path / "metrics.jsonl").read_text().splitlines()
    assert len(lines_before) == 4 * 3

    calls.clear()
    again = RunFolder("exp", {"x": 1}, root=tmp_path)
    rows = again.run(_keys(), fn)
    assert [c for c in calls] == _keys()[4:]  # only the unfinished cells ran
    assert len(rows) == 8 and [{k: r[k] for k in ("model", "lr", "seed")} for r in rows] == _keys()
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 8 * 3 and set(lines_before) <= set(lines)

    calls.clear()
    again.run(_keys(), fn)
    assert calls == []
    assert again.done({"seed": 0, "lr": 0.1, "model": "mlp"})["final_test_accuracy"] == 0.5
    assert again.done({"model": "mlp", "lr": 0.5, "seed": 0}) is None


def test_run_grouped_passes_whole_groups_of_pending_cells(tmp_path):
    """A group with a missing cell runs with all its cells (a fresh run's company); only the
    missing cells are recorded; a group whose cells are all done does not run."""
    run = RunFolder("exp", {}, root=tmp_path)
    done = [{"model": "mlp", "lr": 0.1, "seed": 1}]
    done += [{"model": "cnn", "lr": 0.03, "seed": s} for s in (0, 1)]
    for key in done:
        run.record(key, *_cell(key))
    groups = []

    def fn(keys):
        groups.append([(k["model"], k["lr"], k["seed"]) for k in keys])
        return [_cell(k) for k in keys]

    run.run_grouped(_keys(), fn, vary=("seed",))
    assert groups == [
        [("mlp", 0.1, 0), ("mlp", 0.1, 1)],
        [("mlp", 0.03, 0), ("mlp", 0.03, 1)],
        [("cnn", 0.1, 0), ("cnn", 0.1, 1)],
    ]
    assert len(run.rows()) == 8 and run.disagreements == []


def test_summary_schema_nan_as_null_and_files(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunFolder("exp", {"y": 2}, out=tmp_path / "r")
    run.run(list(reversed(_keys())), _cell)  # recorded out of order
    fig = runs.curves_figure({"a": [[{"step": 1, "train_loss": 1.0, "test_accuracy": 0.3}]]})
    extra = plt.figure()
    plt.plot([0, 1])
    table = runs.mean_std_table(run.rows(), index=("model",), columns="lr")
    paths = run.finish(table, {"plot": fig, "extra": extra})
    assert not plt.fignum_exists(extra.number)  # pyplot figures are closed
    names = sorted(os.listdir(run.path))
    assert names == [
        "cells",
        "config.json",
        "extra.png",
        "metrics.jsonl",
        "plot.png",
        "summary.json",
        "table.md",
    ]
    assert not [n for n in os.listdir(run.path / "cells") if n.endswith(".tmp")]
    assert paths["plot"] == run.path / "plot.png"
    assert (run.path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    text = (run.path / "summary.json").read_text()
    assert "NaN" not in text
    summary = json.loads(text)  # strict JSON
    assert set(summary) == {"experiment", "rows"} and summary["experiment"] == "exp"
    rows = summary["rows"]
    assert [(r["model"], r["lr"], r["seed"]) for r in rows] == sorted(
        [(k["model"], k["lr"], k["seed"]) for k in _keys()]
    )
    bad = [r for r in rows if r["model"] == "cnn" and r["lr"] == 0.1]
    assert bad and all(r["final_test_accuracy"] is None and r["diverged"] for r in bad)
    for line in (run.path / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert {"model", "lr", "seed", "step", "train_loss"} <= set(rec)
    md = (run.path / "table.md").read_text()
    assert "| model | lr=0.03 | lr=0.1 |" in md and "| cnn | 55.0 ± 7.1 | diverged |" in md


def test_to_json_strict():
    text = runs.to_json({"a": [np.float32("inf"), np.int64(3), np.bool_(True)], "b": np.arange(2)})
    assert json.loads(text) == {"a": [None, 3, True], "b": [0, 1]}
    with pytest.raises(TypeError, match="cannot write"):
        runs.to_json({"a": object()})


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = runs.atomic_write_text(tmp_path / "f.txt", "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        runs.atomic_write_text(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]


def test_tables_and_format():
    assert runs.format_mean_std([0.981, 0.978, 0.984]) == "98.1 ± 0.3"
    assert runs.format_mean_std([]) == "–"
    with pytest.raises(ValueError, match="cells"):
        runs.markdown_table(["a", "b"], [[1]])


def test_progress_log_lines(capsys):
    import io

    buf = io.StringIO()
    assert list(runs.progress(range(3), desc="cells", file=buf)) == [0, 1, 2]
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("[cells] 3/3 done") and "ETA" in lines[0]


def test_cli_parser():
    p = runs.cli_parser("x")
    a = p.parse_args([])
    assert (a.quick, a.out, a.seeds, a.dataset, a.model, a.steps) == (
        False,
        None,
        None,
        "digits",
        None,
        None,
    )
    a = p.parse_args(["--model", "mlp", "cnn", "--steps", "5", "--out", "d", "--dataset", "mnist"])
    assert a.model == ["mlp", "cnn"] and a.steps == 5 and a.out == "d" and a.dataset == "mnist"
    with pytest.raises(SystemExit):
        p.parse_args(["--seeds", "0"])


def test_metrics_jsonl_repaired_after_interrupted_append(tmp_path):
    keys = _keys()
    run = RunFolder("exp", {"z": 3}, root=tmp_path)
    for key in keys[:3]:
        run.record(key, *_cell(key))
    with open(run.path / "metrics.jsonl", "a") as f:
        f.write('{"model": "mlp", "st')  # killed in the middle of an append
    again = RunFolder("exp", {"z": 3}, root=tmp_path)
    again.record(keys[3], *_cell(keys[3]))
    again.record(keys[0], *_cell(keys[0]))  # re-recording a cell does not duplicate its lines
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 * 3
    assert sorted({(r["model"], r["lr"], r["seed"]) for r in lines}) == sorted(
        (k["model"], k["lr"], k["seed"]) for k in keys[:4]
    )


def test_report_finishes_and_prints_the_table_paths_and_time(tmp_path, capsys):
    run = RunFolder("exp", {"y": 3}, out=tmp_path / "r")
    run.run(_keys(), _cell)
    paths = run.report("| t |\n", {}, num_runs=4, started=time.perf_counter())
    assert set(paths) == {"metrics", "summary", "table"} and paths["table"].exists()
    out, err = capsys.readouterr()
    assert out.startswith("| t |\n")
    assert f"[exp] summary: {paths['summary']}" in out
    assert f"[exp] 4 runs, 2 diverged, 0s wall time, in {run.path}" in err
    run.report("| t |\n")  # defaults: every row of the folder, wall time since creation
    assert "[exp] 8 runs, 2 diverged, " in capsys.readouterr().err
