"""Smoke tests of the pipeline runtime and memory studies (issue 15) on their smallest sizes.

Each runs a script's ``main(["--quick", ...])`` in-process (8 emulated CPU devices from the root
``conftest.py``) and checks its claims that hold exactly: the schedule efficiency measured on the
devices' ``busy`` counters is GPipe's ``M / (M + N − 1)`` and 1F1B's 1 in the steady state; the
memory formula equals the emulator's carried state to the byte, and the mesh executor's
per-device formula its state; XLA's analysis agrees within a tolerance.
"""

from fractions import Fraction

import pytest

from benchmarks import pipeline_memory, pipeline_runtime


@pytest.mark.slow  # long: compiles many executables; `make test-slow`
def test_runtime_quick_efficiency_is_theory(tmp_path):
    out = pipeline_runtime.main(["--quick", "--out", str(tmp_path)])
    rows = out["rows"]
    assert {r["N"] for r in rows} == {2}
    gpipe = {r["M"]: r for r in rows if r["kind"] == "gpipe"}
    assert sorted(gpipe) == [1, 2, 4]
    for m, r in gpipe.items():  # steady-state window and whole run: exactly the bubble
        assert Fraction(r["busy"], r["stage_ticks"]) == Fraction(m, m + 1)
        assert Fraction(r["run_busy"], r["run_stage_ticks"]) == Fraction(m, m + 1)
    assert Fraction(gpipe[4]["busy"], gpipe[4]["stage_ticks"]) == Fraction(4, 4 + 2 - 1)
    (f1b,) = [r for r in rows if r["kind"] == "1f1b"]
    assert f1b["busy"] == f1b["stage_ticks"] > 0  # 1F1B's steady state: no bubble
    assert f1b["run_busy"] < f1b["run_stage_ticks"]  # warm-up and cool-down
    (unsplit,) = [r for r in rows if r["kind"] == "unsplit"]
    assert unsplit["x unsplit"] == 1.0
    assert all(r["ms / mini-batch"] > 0 for r in rows)
    assert (tmp_path / "pipeline_runtime.png").stat().st_size > 0
    assert "| 2 | GPipe M=4 | 4 |" in (tmp_path / "pipeline_runtime.md").read_text()


@pytest.mark.slow  # long end to end; `make test-slow`
def test_memory_quick_formula_is_carried_state(tmp_path):
    out = pipeline_memory.main(["--quick", "--out", str(tmp_path)])
    rows = {r["policy"]: r for r in out["rows"]}
    assert set(rows) == {"vanilla", "stash", "spectrain"}
    n = len(rows["stash"]["carried"])
    for r in rows.values():
        assert r["carried"] == [
            {k: f[k] for k in ("weights", "optimizer", "slots", "total")} for f in r["formula"]
        ]
        assert r["mesh_state_per_device"] == r["mesh_formula_per_device"]
        carried = sum(c["total"] for c in r["carried"])
        # XLA: the donated state is aliased; the arguments add the data and program tables
        assert abs(r["emulator_alias"] - carried) <= 0.01 * carried
        assert carried <= r["emulator_argument"] <= 1.5 * carried
        assert abs(r["mesh_alias"] - r["mesh_state_per_device"]) <= 0.01 * r["mesh_alias"]
    # PipeDream: stage k keeps N − k weight versions; vanilla and prediction one
    assert [f["versions"] for f in rows["stash"]["formula"]] == [n - k for k in range(n)]
    assert {f["versions"] for f in rows["spectrain"]["formula"]} == {1}
    p = [f["params"] for f in rows["vanilla"]["formula"]]
    extra = [
        s["optimizer"] - v["optimizer"]
        for s, v in zip(rows["spectrain"]["carried"], rows["vanilla"]["carried"], strict=True)
    ]
    assert extra == [4 * pk + 4 for pk in p]  # Δw_last and a count
    assert (tmp_path / "pipeline_memory.png").stat().st_size > 0
