"""experiments/claims.py: verdicts from paired per-seed differences, conditions, the report."""

import json

import pytest

from experiments import claims


def _rows(accs: dict[tuple[str, int], list[float | None]], lr: float = 0.01, mu: float = 0.9):
    out = []
    for (method, m), vals in accs.items():
        for s, v in enumerate(vals):
            out.append(
                {"method": method, "workers": m, "momentum": mu, "lr": lr, "lam": None, "seed": s,
                 "diverged": v is None, "final_val_accuracy": v, "final_test_accuracy": v}
            )  # fmt: skip
    return out


def _folder(root, name, rows, workers):
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    (d / "config.json").write_text(json.dumps({"config": {"workers": workers}}))


def test_diff_sign_and_verdicts():
    a = [{"seed": s, "final_test_accuracy": v} for s, v in enumerate([0.95, 0.96, 0.97])]
    b = [{"seed": s, "final_test_accuracy": v} for s, v in enumerate([0.90, 0.905, 0.91])]
    up = claims.diff(a, b, "a", "b")
    assert up.sign == 1 and "beyond noise" in up.text()
    down = claims.diff(b, a, "b", "a")
    assert down.sign == -1
    noisy = claims.diff(a, [{**r, "final_test_accuracy": 0.96} for r in a], "a", "c")
    assert noisy.sign == 0 and "within noise" in noisy.text()
    assert claims.verdict_of([up]) == "held"
    assert claims.verdict_of([up, noisy]) == "within noise"
    assert claims.verdict_of([up, down]) == "did not hold"


def test_selected_uses_validation_not_test():
    rows = _rows({("asgd", 4): [0.9, 0.9]}, lr=0.1) + _rows({("asgd", 4): [0.8, 0.8]}, lr=0.01)
    for r in rows:  # test accuracy says the opposite
        r["final_test_accuracy"] = 1.0 - r["final_val_accuracy"]
    pick = claims.selected(rows, method="asgd", workers=4)
    assert {r["lr"] for r in pick} == {0.1}


def test_held_only_when_a_condition_holds(tmp_path):
    same = [0.96, 0.97, 0.95, 0.96, 0.97]
    main = _rows({("sgd", 1): same, ("gap-aware", 16): same, ("sa-asgd", 16): same,
                  ("asgd", 16): same, ("gap-aware", 32): same, ("sa-asgd", 32): same})  # fmt: skip
    _folder(tmp_path, "async", main, [16, 32])
    fixed = _rows({("gap-aware", 16): [0.97, 0.972, 0.969, 0.971, 0.97],
                   ("sa-asgd", 16): [0.95, 0.951, 0.949, 0.95, 0.952]})  # fmt: skip
    _folder(tmp_path, "async-fixed-lr", fixed, [16])
    ctx = claims.Context(tmp_path, quick=False)
    v = claims.judge_gap_aware(ctx)
    assert v.verdict == "held only when one fixed rate (0.02), round-robin, M = 16"
    assert "within noise" in v.evidence and "| gap-aware |" in v.tables[0]


def test_acceptance_check(tmp_path):
    rows = _rows({("asgd", 16): [None, 0.1, 0.1], ("gap-aware", 16): [0.97] * 3,
                  ("sa-asgd", 16): [0.96] * 3, ("dc-asgd-a", 16): [0.93] * 3}, lr=0.02)  # fmt: skip
    _folder(tmp_path, "async-fixed-lr", rows, [16])
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held" and "1/3 seeds with a non-finite loss" in v.evidence
    rows = [r for r in rows if r["method"] != "dc-asgd-a"] + _rows(
        {("dc-asgd-a", 16): [0.5] * 3}, lr=0.02
    )
    (tmp_path / "async-fixed-lr" / "summary.json").write_text(json.dumps({"rows": rows}))
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == "did not hold" and "DC-ASGD-a > 90 %: no" in v.evidence


def test_report_marks_missing_runs_and_links_every_claim(tmp_path):
    out = tmp_path / "docs" / "claims.md"
    res = claims.main(["--results", str(tmp_path / "none"), "--out", str(out)])
    text = out.read_text()
    assert res["text"] == text
    for c in claims.CLAIMS:
        assert f'<a id="{c.id.lower()}"></a>' in text and f"](#{c.id.lower()})" in text
    assert "**not run**" in text


def test_unknown_configuration_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(["--only", "nope"])
    assert e.value.code == 2 and "unknown configuration 'nope'" in capsys.readouterr().err
