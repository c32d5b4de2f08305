"""study/speed.py: the speed readings of a run's test curve (the mean over
its evaluations, the value at a third of the budget), copied into the rows with the test
predictions, and the pipeline claims' speed lines paired by seed."""

import json
import shutil

import numpy as np
import pytest

import study as claims
from experiments import runs
from study import cells, speed
from study.provenance import with_archived_curves, with_predictions

#: one seed's luck, shared by its arms (the paired differences below are exact)
LUCK = [0.0, 0.003, -0.003, 0.001, -0.001]


def _write(root, name, rows, dataset, **config):
    """A hand-built run folder: its rows and its configuration."""
    d = root / name
    d.mkdir(exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    (d / "config.json").write_text(json.dumps({"config": {"dataset": dataset, **config}}))


def _curve(values, every=100):
    return [{"step": every * (i + 1), "test_accuracy": v} for i, v in enumerate(values)]


def test_curve_facts_hand_computed():
    facts = speed.curve_facts(_curve([0.2, 0.4, 0.6, 0.8, 0.9, 0.9]), budget=600)
    assert facts == {"test_mean": pytest.approx(3.8 / 6), "test_third": 0.4, "third_step": 200}
    # a budget in other units than the curve's steps (smaller than its last) is not used
    assert speed.curve_facts(_curve([0.2, 0.4, 0.6]), budget=3)["third_step"] == 100
    # a loss curve; a diverged run's non-finite records are left out
    loss = [{"step": s, "test_loss": v} for s, v in ((1, 3.0), (2, 2.0), (3, 1.0), (4, np.nan))]
    assert speed.curve_facts(loss, budget=4) == {
        "test_mean": 2.0,
        "test_third": 3.0,
        "third_step": 1,
    }
    assert speed.curve_facts([{"step": 1, "train_loss": 2.0}]) == {}
    assert speed.curve_facts([{"step": 1, "test_accuracy": None}]) == {}


def test_the_rows_copy_takes_the_speed_readings_from_each_cells_curve(tmp_path):
    (tmp_path / "cells").mkdir()
    for seed in (0, 1):
        key = {"method": "sync", "lr": 0.1, "seed": seed}
        cell = {"key": key, "row": {"steps": 300}, "metrics": _curve([0.5, 0.7 + seed / 10, 0.9])}
        (tmp_path / "cells" / f"{seed}.json").write_text(json.dumps(cell))
    rows = [{"method": "sync", "lr": 0.1, "seed": s, "final_test_accuracy": 0.9} for s in (0, 1)]
    out = with_predictions(tmp_path, {"rows": rows})["rows"]
    assert out[0]["test_mean"] == pytest.approx(0.7) and out[0]["test_third"] == 0.5
    assert out[1]["test_mean"] == pytest.approx(0.7333333) and out[1]["third_step"] == 100
    assert "test_correct" not in out[0] and "test_mean" not in rows[0]  # the input unchanged


def _pipe(method, base, n=8):
    """Rows of one (policy, depth) cell: 5 seeds, final accuracy 0.85; mean test accuracy over
    the run ``base`` + the seed's luck, at a third ``base`` − 0.1."""
    return [{"method": method, "model": "mlp", "stages": n, "lr": 0.01, "seed": s,
             "diverged": False, "final_val_accuracy": 0.85, "final_test_accuracy": 0.85,
             "test_mean": base + j, "test_third": base - 0.1 + j, "third_step": 9000 - (n - 1)}
            for s, j in enumerate(LUCK)]  # fmt: skip


def test_p1_lists_the_speed_readings_paired_by_seed(tmp_path):
    rows = [*_pipe("sync", 0.80), *_pipe("vanilla", 0.77), *_pipe("stash", 0.775),
            *_pipe("spectrain-v1", 0.79), *_pipe("nesterov", 0.79)]  # fmt: skip
    rows[0]["third_step"] = 9000  # sync's evaluation falls a few updates later
    rows[-1].update(diverged=True, final_test_accuracy=None)  # NAG's last seed: no curve
    for k in ("test_mean", "test_third", "third_step"):
        del rows[-1][k]
    _write(tmp_path, "pipeline", rows, "mnist1d")
    v = claims.claim("P1").assess(claims.Context(tmp_path, quick=False))
    lines = v.evidence.splitlines()
    at = lines.index("- speed, from the test curves (no claimed direction; not in the verdict):")
    assert lines[at + 1].startswith(
        "  - the mean test accuracy over the run's evaluations: sync (N=8) − vanilla "
        "(N=8) = +3.0 ± 0.0 points (5 seeds, beyond noise); stash (N=8) − vanilla (N=8) = +0.5"
    )
    assert "spectrain-v1 (N=8) − vanilla (N=8) = +2.0" in lines[at + 1]
    assert (
        "nesterov (N=8) − vanilla (N=8) = +2.0 ± 0.0 points (4 seeds, beyond noise); intention"
        in (lines[at + 1])
    )  # the diverged seed left out, and scored at chance in the intention-to-treat companion
    assert lines[at + 2].startswith(
        "  - the test accuracy at about update 9,000 (the last evaluation within a third "
        "of the budget): sync (N=8) − vanilla (N=8) = +3.0"
    )
    assert v.verdict.startswith("within noise")  # the final accuracies are equal: not in it


def test_rows_without_the_readings_give_no_speed_lines():
    rows = [{"seed": 0, "final_test_accuracy": 0.5}]
    assert speed.notes([(rows, rows, "a", "b")], claims.diff) == []


def _sweep(tmp_path, lr, curves):
    """A run folder ``results/demo`` (config lr) with one cell per seed, packed."""
    folder = runs.RunFolder("demo", {"lr": lr}, out=tmp_path / "results" / "demo")
    for seed, curve in enumerate(curves):
        folder.record({"seed": seed}, {"acc": curve[-1]["test_accuracy"]}, curve)
    cells.pack(tmp_path / "results", tmp_path / "cells", ["demo"])
    return json.loads((tmp_path / "results" / "demo" / "config.json").read_text())


def test_kept_rows_gain_the_speed_readings_of_their_own_archived_sweep(tmp_path):
    old = _sweep(tmp_path, 0.1, [_curve([0.1, 0.2, 0.3])] * 2)
    shutil.rmtree(tmp_path / "results")
    new = _sweep(tmp_path, 0.2, [_curve([0.5, 0.6, 0.7]), _curve([0.5, 0.7, 0.9])])
    assert len(cells.sweep(tmp_path / "cells", "demo", old)) == 2
    assert [c["metrics"][0]["test_accuracy"] for c in cells.sweep(tmp_path / "cells", "demo", new)]
    rows = tmp_path / "rows" / "demo"
    rows.mkdir(parents=True)
    summary = {"rows": [{"seed": s, "acc": 0.8, "test_correct": "x"} for s in (0, 1)]}
    (rows / "summary.json").write_text(json.dumps(summary))
    (rows / "config.json").write_text(json.dumps(new))
    done = with_archived_curves(tmp_path / "rows", tmp_path / "cells", ["demo", "absent"])
    got = json.loads((rows / "summary.json").read_text())["rows"]
    assert done == ["demo"] and got[0]["test_correct"] == "x"
    assert got[0]["test_mean"] == pytest.approx(0.6) and got[1]["test_mean"] == pytest.approx(0.7)
    # nothing more to add: nothing rewritten; rows of a sweep not archived: left as they are
    assert with_archived_curves(tmp_path / "rows", tmp_path / "cells", ["demo"]) == []
    (rows / "summary.json").write_text(json.dumps(summary))
    (rows / "config.json").write_text(json.dumps({**new, "config": {"lr": 0.3}}))
    assert with_archived_curves(tmp_path / "rows", tmp_path / "cells", ["demo"]) == []
    assert json.loads((rows / "summary.json").read_text()) == summary


def test_c3_lists_the_speed_readings_at_every_worker_count(tmp_path):
    rows = []
    for m, w, base in [("sgd", 1, 0.8), *[(x, w, b) for w in (4, 8) for x, b in
                       (("asgd", 0.7), ("dana", 0.75))]]:  # fmt: skip
        rows += [{"method": m, "workers": w, "momentum": 0.9, "lr": 0.01, "lam": None,
                  "seed": s, "diverged": False, "final_val_accuracy": 0.8,
                  "final_test_accuracy": 0.8, "test_mean": base + j, "test_third": base + j,
                  "third_step": 9000} for s, j in enumerate(LUCK)]  # fmt: skip
    _write(tmp_path, "async", rows, "mnist1d", workers=[4, 8])
    v = claims.claim("C3").assess(claims.Context(tmp_path, quick=False))
    assert (
        "  - the mean test accuracy over the run's evaluations: dana (M=4) − asgd (M=4) = "
        "+5.0 ± 0.0 points (5 seeds, beyond noise); dana (M=8) − asgd (M=8) = +5.0"
    ) in v.evidence
    assert "the test accuracy at update 9,000 (the last evaluation" in v.evidence


def test_m2_lists_what_each_policy_loses_in_speed_against_sync(tmp_path):
    rows = [*_pipe("sync", 0.80), *_pipe("2bw", 0.78), *_pipe("pipemare", 0.75)]
    _write(tmp_path, "pipeline-n8", rows, "mnist1d")
    v = claims.claim("M2").assess(claims.Context(tmp_path, quick=False))
    assert (
        "  - the mean test accuracy over the run's evaluations: sync (N=8) − 2bw (N=8) = +2.0 ± "
        "0.0 points (5 seeds, beyond noise); sync (N=8) − pipemare (N=8) = +5.0"
    ) in v.evidence


def test_lm1_reads_the_speed_in_nats_and_d1_in_points(tmp_path):
    lm = [{"method": m, "stages": n, "model": "gpt-cpu", "lr": 0.003, "seed": s, "diverged": False,
           "final_val_loss": 2.0, "final_test_loss": 2.0 + g, "test_mean": 2.5 + g + j,
           "test_third": 3.0 + g, "third_step": 330}
          for m, g in (("sync", 0.0), ("vanilla", 0.4)) for n in (4, 8)
          for s, j in enumerate(LUCK)]  # fmt: skip
    _write(tmp_path, "lm-depth", lm, "shakespeare")
    v = claims.claim("LM1").assess(claims.Context(tmp_path, quick=False))
    assert (
        "  - the mean test loss over the run's evaluations: vanilla (N=4) − sync (N=4) = +0.400 ± "
        "0.000 nats (5 seeds, beyond noise)"
    ) in v.evidence
    dl = [{"method": m, "workers": 4, "inner_steps": h, "lr": 0.7, "seed": s, "diverged": False,
           "final_val_accuracy": 0.9, "final_test_accuracy": 0.9, "test_mean": b + j,
           "test_third": b + j, "third_step": 700}
          for m, h, b in (("dp", 10, 0.85), ("diloco", 10, 0.84), ("diloco", 50, 0.8))
          for s, j in enumerate(LUCK)]  # fmt: skip
    _write(tmp_path, "diloco", dl, "mnist1d")
    v = claims.claim("D1").assess(claims.Context(tmp_path, quick=False))
    assert (
        "  - the mean test accuracy over the run's evaluations: diloco (H=10) − dp = -1.0 ± 0.0 "
        "points (5 seeds, beyond noise); diloco (H=50) − dp = -5.0"
    ) in v.evidence


def test_the_report_header_says_what_the_speed_lines_are(tmp_path):
    text = claims.report(claims.Context(tmp_path, quick=False), tmp_path / "docs" / "claims.md")
    assert "Under a claim, **speed** lines pair each arm's learning curve by seed" in text
    assert "these lines are not in the verdict" in text
