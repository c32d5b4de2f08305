"""sync_baseline end to end on a tiny config: run folder files, table, resume."""

import json

import pytest

from experiments import sync_baseline
from jaxstale import train

ARGS = ["--quick", "--steps", "6", "--eval-every", "3", "--seeds", "2", "--lrs", "0.05"]


def test_end_to_end_and_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    run = sync_baseline.main([*ARGS, "--out", str(out)])
    printed = capsys.readouterr().out
    assert run.path == out
    for name in ("config.json", "metrics.jsonl", "summary.json", "table.md", "plot.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG"

    config = json.loads((out / "config.json").read_text())
    assert config["experiment"] == "sync_baseline"
    assert config["config"]["models"] == ["mlp", "cnn"] and config["config"]["steps"] == 6

    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "sync_baseline"
    rows = summary["rows"]
    assert [(r["model"], r["lr"], r["seed"]) for r in rows] == [
        ("cnn", 0.05, 0),
        ("cnn", 0.05, 1),
        ("mlp", 0.05, 0),
        ("mlp", 0.05, 1),
    ]  # sorted by key
    for r in rows:
        assert r["method"] == "sgd" and r["steps"] == 6 and r["batch_size"] == 64
        assert r["diverged"] is False and r["diverged_step"] is None
        assert 0.0 <= r["final_test_accuracy"] <= 1.0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 4 * 2  # 4 cells x evaluations at steps 3 and 6
    assert {m["step"] for m in metrics} == {3, 6}
    assert {"method", "model", "lr", "seed", "train_loss", "test_accuracy"} <= set(metrics[0])

    table = (out / "table.md").read_text()
    assert "| model | lr=0.05 |" in table and "| mlp |" in table and "| cnn |" in table
    assert "| model | lr=0.05 |" in printed
    assert str(out / "table.md") in printed and str(out / "plot.png") in printed

    # Resume: the same config again trains nothing and writes the same summary.
    calls = []
    real_fit = train.fit
    monkeypatch.setattr(train, "fit", lambda *a, **k: calls.append(a) or real_fit(*a, **k))
    sync_baseline.main([*ARGS, "--out", str(out)])
    assert calls == []
    assert json.loads((out / "summary.json").read_text())["rows"] == rows

    # An interrupted run (one cell missing) re-trains only that cell.
    key = {"method": "sgd", "model": "mlp", "lr": 0.05, "seed": 1}
    run._cell_path(key).unlink()
    monkeypatch.setattr(train, "fit", lambda *a, **k: calls.append(k["seeds"]) or real_fit(*a, **k))
    sync_baseline.main([*ARGS, "--out", str(out)])
    assert calls == [[1]]
    # Seed 1 alone is a 1-lane vmap instead of a 2-lane one: the same run up to float rounding
    # (bitwise equal on raw digits, a few float32 ulps apart on standardised inputs).
    again = json.loads((out / "summary.json").read_text())["rows"]
    assert len(again) == len(rows)
    for r, r0 in zip(again, rows, strict=True):
        assert r.keys() == r0.keys()
        for k, v in r0.items():
            if k != "wall_s":
                assert r[k] == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), k
