"""experiments/async_bn.py end to end, tiny: rows, shared weights, table, resume, errors."""

import json

import pytest

from experiments import async_bn

TINY = ["--quick", "--steps", "12", "--workers", "1,4", "--batch-size", "16"]


def test_end_to_end_policies_share_weights_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    argv = [*TINY, "--out", str(out)]
    res = async_bn.main(argv)
    for name in ["summary.json", "table.md", "plot.png", "curves.png", "metrics.jsonl"]:
        assert (out / name).exists(), name
    rows = json.loads((out / "summary.json").read_text())["rows"]
    by = {(r["method"], r["decay"], r["workers"]): r for r in rows}
    assert set(by) == {
        (m, d, w) for m, d in [("lc-asgd", None), ("lc-asgd-async-bn", 0.1)] for w in (1, 4)
    }
    for w in (1, 4):
        group = [r for r in rows if r["workers"] == w]
        # training-mode gradients never read the running statistics: identical weights
        assert len({r["params_checksum"] for r in group}) == 1
        assert len({r["final_test_error_recomputed"] for r in group}) == 1
        assert all(r["max_staleness"] == (0 if w == 1 else r["max_staleness"]) for r in group)
    # one worker: its copy is the server's, and d = 1 − m is the model's own EMA
    one = by[("lc-asgd", None, 1)]["final_test_error"]
    assert by[("lc-asgd-async-bn", 0.1, 1)]["final_test_error"] == pytest.approx(one, abs=1e-9)
    assert by[("lc-asgd", None, 4)]["max_staleness"] > 0
    table = res["table"]
    assert "lc-asgd (ordinary BN)" in table and "lc-asgd-async-bn (d=0.1)" in table
    assert "recomputed statistics (same weights)" in table and "Paired by seed" in table
    monkeypatch.setattr(async_bn, "_run_group", lambda *a: pytest.fail("recomputed a done cell"))
    async_bn.main(argv)


def test_config_decays_and_defaults():
    cfg = lambda argv: async_bn.config_from_args(async_bn.parser().parse_args(argv))
    assert cfg([])["decays"] == [0.1, 0.02, 0.3] and cfg([])["workers"] == [1, 4, 8, 16]
    assert cfg(["--quick"])["decays"] == [0.1]
    assert cfg(["--decays", "0.5,0.1"])["decays"] == [0.1, 0.5]  # the default first, no repeats
    assert cfg([])["model"] == "resnet20"


def test_paired_differences_match_seeds_and_skip_diverged_runs():
    row = lambda method, decay, seed, err: {
        "method": method, "decay": decay, "workers": 4, "seed": seed, "final_test_error": err
    }  # fmt: skip
    rows = [
        row("lc-asgd", None, 0, 0.30), row("lc-asgd", None, 1, 0.10), row("lc-asgd", None, 2, None),
        row("lc-asgd-async-bn", 0.1, 1, 0.15), row("lc-asgd-async-bn", 0.1, 0, 0.20),
        row("lc-asgd-async-bn", 0.1, 2, 0.05), row("lc-asgd-async-bn", 0.5, 0, 0.0),
    ]  # fmt: skip
    assert async_bn.paired_differences(rows, 0.1, 4) == pytest.approx([-5.0, 10.0])
    assert async_bn.paired_differences(rows, 0.1, 8) == []


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="decays must be in"):
        async_bn.main([*TINY, "--decays", "1.5", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match="no batch-norm"):
        async_bn.main([*TINY, "--model", "mlp", "--out", str(tmp_path / "b")])
