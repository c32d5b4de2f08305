"""benchmarks/pipeline_memory_gpt.py: the GPT pipeline's carried state equals the formula to the
byte (abstract shapes: nothing is allocated or compiled)."""

import pytest

from benchmarks import pipeline_memory_gpt as pm


def test_block_residuals_by_hand():
    # mb = 1, T = 2, D = 4, H = 1: 2·(576 + 26 + 8 + 32) + 32 + 12
    assert pm.block_residuals(1, 2, 4, 1) == 2 * (144 * 4 + 13 * 2 + 8 + 32) + 8 * 4 + 12


@pytest.mark.parametrize(
    ("preset", "n", "policy"),
    [
        ("gpt-tiny", 2, "vanilla"),
        ("gpt-tiny", 2, "stash"),
        pytest.param("gpt-cpu", 4, "stash", marks=pytest.mark.slow),
    ],
)
def test_carried_state_is_the_formula(preset, n, policy):
    got = pm.measure(preset, n, 8, 64, policy)["carried"]
    want = pm.formula(preset, n, 8, 64, stash=policy == "stash")
    assert [g["total"] for g in got] == [w["total"] for w in want]
    assert [g["residuals"] for g in got] == [w["residuals"] for w in want]


def test_recompute_keeps_no_residuals():
    saved = pm.formula("gpt-gpu", 12, 8, 1024, stash=False)
    recompute = pm.formula("gpt-gpu", 12, 8, 1024, stash=False, saved=False)
    assert recompute[0]["residuals"] == 4 * 8 * 1024 * 768  # the cotangent slot alone
    assert saved[0]["total"] > 100 * recompute[0]["total"]
    # a stash recomputes its forward at the stashed version (issue 54: it used to keep them)
    stash = pm.formula("gpt-gpu", 12, 8, 1024, stash=True, saved=False)
    assert stash[0]["residuals"] == recompute[0]["residuals"]
    got = pm.measure("gpt-tiny", 2, 8, 64, "stash", backward="recompute")["carried"]
    want = pm.formula("gpt-tiny", 2, 8, 64, stash=True, saved=False)
    assert [g["total"] for g in got] == [w["total"] for w in want]
