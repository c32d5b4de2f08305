"""study/: the judges on hand-built run folders, selection, the report (the verdict
rule itself, trends, the chance level and intention to treat: test_claims_verdicts.py)."""

import json

import pytest

import study as claims
from study import asynchronous


def _rows(accs: dict[tuple[str, int], list[float | None]], lr: float = 0.01, mu: float = 0.9):
    out = []
    for (method, m), vals in accs.items():
        for s, v in enumerate(vals):
            out.append(
                {"method": method, "workers": m, "momentum": mu, "lr": lr, "lam": None, "seed": s,
                 "diverged": v is None, "final_val_accuracy": v, "final_test_accuracy": v}
            )  # fmt: skip
    return out


def _folder(root, name, rows, workers, dataset="digits", **config):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    cfg = {"workers": workers, "dataset": dataset, **config}
    (d / "config.json").write_text(json.dumps({"config": cfg}))


def test_selected_uses_validation_not_test():
    rows = _rows({("asgd", 4): [0.9, 0.9]}, lr=0.1) + _rows({("asgd", 4): [0.8, 0.8]}, lr=0.01)
    for r in rows:  # test accuracy says the opposite
        r["final_test_accuracy"] = 1.0 - r["final_val_accuracy"]
    pick = claims.selected(rows, method="asgd", workers=4)
    assert {r["lr"] for r in pick} == {0.1}


def _a1(accs=None):
    base = {
        ("asgd", 16): [None, 0.1, 0.1],
        ("gap-aware", 16): [0.97] * 3,
        ("sa-asgd", 16): [0.96] * 3,
        ("dc-asgd-a", 16): [0.93] * 3,
        ("sgd", 1): [0.98] * 3,
    }
    return _rows({**base, **(accs or {})}, lr=0.02)  # fmt: skip


def test_acceptance_check(tmp_path):
    """A1 is judged on the simulations' own workload (digits) with their thresholds as written."""
    assert claims.judge_acceptance(claims.Context(tmp_path, quick=False)).verdict == "not run"
    _folder(tmp_path, "async-fixed-lr-digits", _a1(), [16])
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held" and "1/3 seeds with a non-finite loss" in v.evidence
    assert "DC-ASGD-a above 90 % (mean 93.0 %): yes" in v.evidence
    rows = _a1({("dc-asgd-a", 16): [0.5] * 3})
    (tmp_path / "async-fixed-lr-digits" / "summary.json").write_text(json.dumps({"rows": rows}))
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == "did not hold"
    assert "DC-ASGD-a above 90 % (mean 50.0 %): no" in v.evidence


def test_acceptance_on_another_task_is_read_beside_the_verdict_rescaled(tmp_path):
    """Issue 53 rule 7: on MNIST-1D (ASGD trains at 0.02) the thresholds are rescaled to its
    1-worker SGD and read beside the verdict, never as it: 80 % SGD, Gap-Aware at 78 % met."""
    _folder(tmp_path, "async-fixed-lr-digits", _a1(), [16])
    harder = _rows({("asgd", 16): [0.15, 0.12, 0.1], ("gap-aware", 16): [0.78] * 3,
                    ("sa-asgd", 16): [0.775] * 3, ("dc-asgd-a", 16): [0.73] * 3,
                    ("sgd", 1): [0.80] * 3}, lr=0.02)  # fmt: skip
    _folder(tmp_path, "async-fixed-lr", harder, [16])
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held", v.evidence
    assert "rescaled to its 1-worker SGD" in v.evidence and ": every threshold met" in v.evidence
    assert "Gap-Aware within 3 points of 1-worker SGD (80.0 %) (mean 78.0 %): yes" in v.evidence
    # ASGD trains on MNIST-1D: a threshold missed there, the verdict still the digits run's
    trains = [{**r, "final_test_accuracy": 0.7, "final_val_accuracy": 0.7, "diverged": False}
              if r["method"] == "asgd" else r for r in harder]  # fmt: skip
    _folder(tmp_path, "async-fixed-lr", trains, [16])
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held" and ": a threshold missed" in v.evidence
    assert len(v.tables) == 2 and v.tables[1].startswith("MNIST-1D (rescaled, not in the verdict)")


def _cliff_rows(val: dict[tuple[str, int, float], float | None]) -> list[dict]:
    """delay_cliff rows, 3 seeds per (method, d, lr): a validation accuracy, None diverged."""
    return [
        {"method": m, "delay": d, "lr": lr, "seed": s, "diverged": a is None,
         "final_val_accuracy": a, "final_test_accuracy": a}
        for (m, d, lr), a in val.items()
        for s in range(3)
    ]  # fmt: skip


def test_acceptance_reads_where_its_rate_sits_on_the_delay_cliff(tmp_path):
    """A1 names the rates the cliff run finds past ASGD's cliff and stable for the three
    mitigations at the delay nearest τ = M − 1 (d = 16 for M = 16, not 8), its verdict
    unchanged; none where one mitigation needs a rate ASGD survives."""
    _folder(tmp_path, "async-fixed-lr-digits", _a1(), [16])
    _folder(tmp_path, "async-fixed-lr", _a1(), [16])
    before = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert "delay cliff" not in before.evidence
    val = {
        (m, d, lr): 0.9 for m in asynchronous.A1_METHODS for d in (0, 8, 16) for lr in (0.01, 0.1)
    }
    val[("asgd", 16, 0.1)] = None  # ASGD's cliff: 0.1 diverges at d = 16 (not at d = 8)
    _folder(tmp_path, "cliff", _cliff_rows(val), [], tolerance=0.05)
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert v.verdict == before.verdict == "held"
    assert "constant delay d = 16, the nearest to this run's τ = 15" in v.evidence
    assert "asgd 0.01; gap-aware 0.01, 0.1; sa-asgd 0.01, 0.1; dc-asgd-a 0.01, 0.1" in v.evidence
    assert "dc-asgd-a alike: 0.1 (this run's rate: 0.02)" in v.evidence
    val[("sa-asgd", 16, 0.1)] = 0.5  # SA-ASGD unstable where ASGD is past its cliff
    _folder(tmp_path, "cliff", _cliff_rows(val), [], tolerance=0.05)
    v = claims.judge_acceptance(claims.Context(tmp_path, quick=False))
    assert "sa-asgd 0.01;" in v.evidence and "dc-asgd-a alike: none" in v.evidence


def test_report_marks_missing_runs_and_links_every_claim(tmp_path):
    out = tmp_path / "docs" / "claims.md"
    finished = tmp_path / "some" / "other-run"  # one finished folder, no claim's configuration
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text('{"experiment": "x", "rows": []}')
    res = claims.main(["--results", str(tmp_path / "some"), "--out", str(out)])
    text = out.read_text()
    assert res["text"] == text
    for c in claims.CLAIMS:
        assert f'<a id="{c.id.lower()}"></a>' in text and f"[{c.id}](#{c.id.lower()})" in text
    assert "**not run**" in text


@pytest.mark.parametrize(
    "argv",
    [[], ["--only", "async-fixed-lr"], ["--force-resume"]],
    ids=["empty-results", "only-without-run", "force-resume-without-run"],
)
def test_without_run_an_empty_results_folder_writes_nothing(argv, tmp_path, capsys):
    out = tmp_path / "claims.md"
    out.write_text("the committed report\n")
    with pytest.raises(SystemExit) as e:
        claims.main([*argv, "--results", str(tmp_path / "none"), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and ": error: " in err[-1], err
    assert out.read_text() == "the committed report\n"
    assert not (tmp_path / "none").exists()


def test_unknown_configuration_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        claims.main(["--only", "nope"])
    assert e.value.code == 2 and "unknown configuration 'nope'" in capsys.readouterr().err


def _pipe_rows(accs: dict[tuple[str, int], list[float | None]], lr: float = 0.01):
    return [
        {"method": m, "model": "mlp", "stages": n, "lr": lr, "seed": s, "diverged": v is None,
         "final_val_accuracy": v, "final_test_accuracy": v}
        for (m, n), vals in accs.items() for s, v in enumerate(vals)
    ]  # fmt: skip


def test_pipeline_prediction_claim_and_the_n8_moonshot(tmp_path):
    hi, lo = [0.97, 0.968, 0.972, 0.97, 0.969], [0.90, 0.91, 0.905, 0.90, 0.902]
    rows = _pipe_rows({("sync", 4): hi, ("vanilla", 4): lo, ("stash", 4): lo,
                       ("spectrain-v1", 4): hi, ("nesterov", 4): hi,
                       ("sync", 8): hi, ("vanilla", 8): lo, ("spectrain-v1", 8): hi,
                       ("nesterov", 8): [0.96, 0.958, 0.962, 0.96, 0.959]})  # fmt: skip
    _folder(tmp_path, "pipeline", rows, [])
    ctx = claims.Context(tmp_path, quick=False)
    v = claims.claim("P1").assess(ctx)
    assert v.verdict == "held" and "| spectrain-v1 |" in v.tables[0]
    assert "**primary**: spectrain-v1 (N=8) − vanilla (N=8) = +" in v.evidence
    assert "stash (N=4) − vanilla (N=4)" in v.evidence
    assert "  - sync (N=8) − vanilla (N=8) = +6.6" in v.evidence  # what staleness costs
    # the moonshot: 2bw is the best memory-light policy; stash is not memory-light
    n8 = _pipe_rows({("sync", 8): hi, ("2bw", 8): [a - 0.003 for a in hi],
                     ("pipemare", 8): lo})  # fmt: skip
    _folder(tmp_path, "pipeline-n8", n8, [])
    v = claims.judge_moonshot_pipeline(claims.Context(tmp_path, quick=False))
    assert v.verdict == "reached" and "memory-light policies: best on validation spectrain-v1:" in (
        v.evidence
    )  # spectrain-v1 at N = 8 equals sync here: the best on validation
    n8 = _pipe_rows({("sync", 8): hi, ("pipemare", 8): lo})
    (tmp_path / "pipeline-n8" / "summary.json").write_text(json.dumps({"rows": n8}))
    (tmp_path / "pipeline" / "summary.json").write_text(json.dumps({"rows": []}))
    v = claims.judge_moonshot_pipeline(claims.Context(tmp_path, quick=False))
    assert v.verdict == "not reached" and "pipemare" in v.evidence


def test_p1_states_the_validation_target_and_says_when_no_policy_reached_it(tmp_path):
    hi, lo = [0.97, 0.968, 0.972, 0.97, 0.969], [0.90, 0.91, 0.905, 0.90, 0.902]
    policies = ("sync", "vanilla", "spectrain-v1")
    rows = _pipe_rows({(m, n): hi if m == "sync" else lo for m in policies for n in (4, 8)})
    for r in rows:
        r["updates_to_target"] = 300 + r["seed"] if r["stages"] == 4 else None
    _folder(tmp_path, "pipeline", rows, [], target=0.95)
    v = claims.claim("P1").assess(claims.Context(tmp_path, quick=False))
    assert (
        "- updates to the validation target (95 %, the run's --target) at N = 4 (selected "
        "rates): sync 302, vanilla 302, spectrain-v1 302"
    ) in v.evidence
    assert (
        "- no policy reached the validation target (95 %, the run's --target) at N = 8: time to "
        "target not measured"
    ) in v.evidence
    assert "never [0/5]" not in v.evidence


def test_the_n8_moonshot_reads_the_default_policies_only_under_one_set_up(tmp_path):
    hi, lo = [0.97, 0.968, 0.972, 0.97, 0.969], [0.90, 0.91, 0.905, 0.90, 0.902]
    _folder(tmp_path, "pipeline", _pipe_rows({("sync", 8): lo, ("vanilla", 8): hi}), [],
            steps=27000)  # fmt: skip
    n8 = _pipe_rows({("sync", 8): hi, ("2bw", 8): [a - 0.01 for a in hi], ("pipemare", 8): lo})
    _folder(tmp_path, "pipeline-n8", n8, [], steps=9000)
    v = claims.judge_moonshot_pipeline(claims.Context(tmp_path, quick=False))
    # vanilla at 27,000 updates is not compared with sync at 9,000
    assert v.verdict == "not reached" and "vanilla" not in v.tables[0], v.evidence
    assert "best on validation 2bw" in v.evidence
    assert (
        "- `pipeline`'s rows not read with `pipeline-n8`'s: its configuration differs outside "
        "methods, policies, schedules, stages (steps 9000 → 27000)"
    ) in v.evidence
    _folder(tmp_path, "pipeline", _pipe_rows({("sync", 8): lo, ("vanilla", 8): hi}), [],
            steps=9000)  # fmt: skip
    v = claims.judge_moonshot_pipeline(claims.Context(tmp_path, quick=False))
    assert v.verdict == "reached" and "best on validation vanilla" in v.evidence
    assert "not read with" not in v.evidence
    # the two runs' sync rows are the same runs computed apart: the report says they differ
    # and reads the primary against `pipeline`'s copy too
    assert (
        "- `pipeline` ran sync at N = 8 too: 5 of the 5 runs both hold differ (seeds 0, 1, 2, 3, "
        "4; computed apart"
    ) in v.evidence
    assert "; with `pipeline`'s: sync of `pipeline` − vanilla = -" in v.evidence
    _folder(tmp_path, "pipeline", _pipe_rows({("sync", 8): hi, ("vanilla", 8): hi}), [],
            steps=9000)  # fmt: skip
    v = claims.judge_moonshot_pipeline(claims.Context(tmp_path, quick=False))
    assert "- `pipeline`'s sync at N = 8 equals `pipeline-n8`'s on all 5 runs both hold" in (
        v.evidence
    )


def test_async_moonshot_picks_the_best_method_on_validation(tmp_path):
    ref = [0.975, 0.97, 0.972, 0.974, 0.971]
    rows = _rows({("sgd", 1): ref, ("gap-aware", 64): [a - 0.002 for a in ref],
                  ("asgd", 64): [0.9] * 5, ("gap-aware", 128): [a - 0.03 for a in ref],
                  ("asgd", 128): [None] * 5})  # fmt: skip
    _folder(tmp_path, "async-m128", rows, [64, 128])
    v = claims.judge_moonshot_async(claims.Context(tmp_path, quick=False))
    assert v.verdict == "not reached"  # M = 128 misses by 3 points
    assert "M = 64: best on validation gap-aware" in v.evidence and "reached" in v.evidence
    assert "M = 128: best on validation gap-aware" in v.evidence
    # a tie on validation: the target must hold for every tied method (here dana misses it)
    tied = _rows({("dana", 64): [a - 0.002 for a in ref]})
    for r in tied:
        r["final_test_accuracy"] -= 0.02
    (tmp_path / "async-m128" / "summary.json").write_text(json.dumps({"rows": rows + tied}))
    v = claims.judge_moonshot_async(claims.Context(tmp_path, quick=False))
    assert "M = 64: best on validation gap-aware (tied on validation with dana)" in v.evidence
    assert "M = 64: best on validation dana (tied on validation with gap-aware)" in v.evidence


def test_delay_cliff_claim_uses_the_experiments_definition_of_stable(tmp_path):
    rows = []
    for d, accs in {0: {0.01: 0.97, 0.1: 0.96}, 4: {0.01: 0.96, 0.1: None}}.items():
        for lr, a in accs.items():
            for s in range(3):
                rows.append({"method": "asgd", "delay": d, "lr": lr, "seed": s,
                             "diverged": a is None, "final_val_accuracy": a,
                             "final_test_accuracy": a})  # fmt: skip
    _folder(tmp_path, "cliff", rows, [], tolerance=0.05)
    v = claims.judge_cliff(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held" and "| asgd | ≥ 0.1 | 0.01 |" in v.tables[0]
    for r in rows:  # the cliff gone: d = 4 trains at 0.1 too
        r["diverged"], r["final_val_accuracy"] = False, 0.96
    (tmp_path / "cliff" / "summary.json").write_text(json.dumps({"rows": rows}))
    assert claims.judge_cliff(claims.Context(tmp_path, quick=False)).verdict == "did not hold"


def test_async_bn_claim_pairs_the_policies_by_seed(tmp_path):
    rows = []
    for m in (1, 8):
        for s in range(4):
            pol = [
                {"policy": "recomputed", "decay": None, "final_val_accuracy": 0.95,
                 "final_test_accuracy": 0.95, "updates_to_target": None},
                {"policy": "ordinary", "decay": 0.1, "final_val_accuracy": 0.80 + 0.01 * s,
                 "final_test_accuracy": 0.80 + 0.01 * s, "updates_to_target": None},
                {"policy": "async-bn", "decay": 0.1, "final_val_accuracy": 0.90 + 0.01 * s,
                 "final_test_accuracy": 0.91 + 0.01 * s, "updates_to_target": None},
            ]  # fmt: skip
            rows.append({"workers": m, "lr": 0.1, "seed": s, "diverged": False, "policies": pol})
    _folder(tmp_path, "async-bn", rows, [1, 8])
    v = claims.claim("C5").assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held" and "async-bn (M=8) − ordinary BN (M=8) = +11.0" in v.evidence
    assert "| recomputed |" in v.tables[0]


@pytest.mark.slow
def test_claims_runs_a_configuration_under_python_m(tmp_path):
    """``python -m study --run`` finds the experiments (its __name__ is __main__)."""
    import subprocess
    import sys

    out = tmp_path / "claims.md"
    cmd = [sys.executable, "-m", "study", "--run", "--quick", "--only",
           "async-fixed-lr", "--results", str(tmp_path / "r"), "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert (tmp_path / "r" / "async-fixed-lr" / "summary.json").exists()
    assert "## A1." in out.read_text()


def test_c4_reads_lc_asgd_at_its_own_lambda_and_flags_an_edge_lambda(tmp_path):
    """C4's primary is LC-ASGD − DC-ASGD-a at M = 16, LC-ASGD at its (rate, λ) selected on
    validation; a λ selected at its grid's edge is said to leave the optimum unbracketed."""
    seeds = [0.0, 0.002, -0.002]
    rows = _rows({("sgd", 1): [0.85 + j for j in seeds], ("asgd", 16): [0.74 + j for j in seeds],
                  ("dc-asgd-a", 16): [0.79 + j for j in seeds]})  # fmt: skip
    for lam, acc in ((-0.1, 0.80), (0.01, 0.70), (0.1, 0.65)):  # λ = −0.1 best: an edge
        for r in _rows({("lc-asgd", 16): [acc + j for j in seeds]}):
            rows.append({**r, "lam": lam})
    _folder(tmp_path, "async", rows, [16])
    v = claims.claim("C4").assess(claims.Context(tmp_path, quick=False))
    assert v.verdict == "held", v.evidence
    assert "lc-asgd (M=16) − dc-asgd-a (M=16) = +1.0" in v.evidence
    assert "M=16: -0.1" in v.evidence
    assert "LC-ASGD's λ at its grid's edge at M = 16: the grid does not bracket" in v.evidence
