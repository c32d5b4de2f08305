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


def test_an_uneven_split_is_read_not_assumed():
    # gpt-cpu over 3 stages: models.split weighs the embedding and head, so the blocks do not
    # fall 3, 3, 2 (the formula used to assume an even split and refuse this case)
    per = pm.stage_blocks("gpt-cpu", 3, 64)
    assert sum(per) == 8 and per != (3, 3, 2)
    for remat in ("none", "names"):
        got = pm.measure("gpt-cpu", 3, 4, 64, "vanilla", remat=remat)["carried"]
        want = pm.formula("gpt-cpu", 3, 4, 64, stash=False, remat=remat)
        assert [g["total"] for g in got] == [w["total"] for w in want], remat


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


def test_slot_bytes_by_hand():
    act = 4 * 2 * 3 * 8  # mb = 2, T = 3, D = 8: one float32 activation
    assert pm.slot_bytes("names", 1, False, 2, 3, 8, 2) == 10 * act  # ln1, qkv, resid, ln2, up
    assert pm.slot_bytes("names", 2, True, 2, 3, 8, 2) == (22 - 1 + 1) * act  # + stream, embed
    assert pm.slot_bytes("dots", 3, False, 2, 3, 8, 2) == (24 + 2) * act  # + stream
    assert pm.slot_bytes("full", 4, True, 2, 3, 8, 2) == 0
    assert pm.slot_bytes("none", 1, False, 2, 3, 8, 2) == pm.block_residuals(2, 3, 8, 2)
    with pytest.raises(ValueError, match="remat must be one of"):
        pm.slot_bytes("some", 1, False, 2, 3, 8, 2)


@pytest.mark.parametrize(
    ("preset", "n"), [("gpt-tiny", 2), pytest.param("gpt-cpu", 4, marks=pytest.mark.slow)]
)
def test_every_remat_carries_its_floor_formula(preset, n):
    # the issue asks for within 10 % of the floor; the carry is the formula to the byte
    rows = pm.remat_rows(preset, n, 16, 64)
    for r in rows:
        assert 0.9 <= r["carried"] / r["formula"] <= 1.1, r
        assert r["carried"] == r["formula"], r
    by = {(r["policy"], r["remat"], r["backward"]): r["carried"] for r in rows}
    for policy in ("vanilla", "stash"):  # each remat keeps less than the one before it
        kept = [by[(policy, r, "saved")] for r in ("none", "names", "dots", "full")]
        assert kept == sorted(kept, reverse=True) and len(set(kept)) == 4
        assert by[(policy, "full", "saved")] == by[(policy, "none", "recompute")]


def test_the_issues_memory_targets_are_met():
    targeted = []
    for preset, n in (("gpt-cpu", 8), ("gpt-gpu", 12)):
        mine = [v[2:] for v in pm.TARGETS if v[:2] == (preset, n)]
        targeted += pm.remat_rows(preset, n, 16, 64, mine)
    assert len(targeted) == len(pm.TARGETS)
    for r in targeted:
        assert r["carried"] == r["formula"] and r["carried"] / pm.MIB <= r["target_mib"], r
