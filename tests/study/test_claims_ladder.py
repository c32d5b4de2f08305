"""study/ladder.py: LM7 (error feedback) and LM8 (basis rotation) judged from hand-built run
folders: the primaries declared before the runs, their expected effects, and "not run"."""

import pytest

from study import ladder
from tests.study.test_claims_language import _ctx, _drows, _folder, _losses, _prows


def test_lm7_primary_is_stale_minus_feedback_and_expects_half_the_gap(tmp_path):
    """AdamW: τ = 0 1.90, stale 2.30, feedback 2.05 (recovers 0.25 / 0.40); Muon's gap 0.02."""
    ad = {("stale", 0): _losses(1.90), ("stale", 1): _losses(2.30),
          ("predicted", 1): _losses(2.10), ("feedback", 1): _losses(2.05)}  # fmt: skip
    mu = {("stale", 0): _losses(1.90), ("stale", 1): _losses(1.92),
          ("predicted", 1): _losses(1.915), ("feedback", 1): _losses(1.91)}  # fmt: skip
    _folder(tmp_path, "lm-ef-adamw", _drows(ad))
    _folder(tmp_path, "lm-ef-muon", _drows(mu))
    ev = ladder.judge_feedback(_ctx(tmp_path))
    assert ev.primary.mean == pytest.approx(0.25) and ev.primary.unit == "nats"
    assert ev.expected == pytest.approx(0.5 * 0.40)
    assert [d.mean for d in ev.secondary["Muon"]] == [pytest.approx(0.01)]
    assert any("recovers 63 %" in n for n in ev.notes)  # 0.25 / 0.40 = 62.5
    assert any("prediction against error feedback" in n for n in ev.notes)
    assert "trigram 1.974" in ev.tables[0]
    claim = next(c for c in ladder.LADDER_CLAIMS if c.id == "LM7")
    assert claim.assess(_ctx(tmp_path)).verdict == "held"


def test_lm8_primary_is_the_difference_of_the_gaps_slopes_in_depth(tmp_path):
    """AdamW's stash − sync gap 0.1, 0.2, 0.3 at N = 2, 4, 8 (+0.1 per doubling); rotation's
    0.05 at every N: the primary is +0.1 per doubling."""
    adam, rot = {}, {}
    for n, g in ((2, 0.1), (4, 0.2), (8, 0.3)):
        adam[("sync", n)], adam[("stash", n)] = _losses(1.9), _losses(1.9 + g)
        rot[("sync", n)], rot[("stash", n)] = _losses(1.85), _losses(1.90)
    _folder(tmp_path, "lm-rotation", _prows(rot), optimizer="rotated")
    _folder(tmp_path, "lm-rotation-adamw", _prows(adam), optimizer="adamw")
    ev = ladder.judge_rotation(_ctx(tmp_path))
    assert ev.primary.mean == pytest.approx(0.1) and ev.primary.n == 5
    sec = ev.secondary["rotated stash beats AdamW stash at each N"]
    assert [round(d.mean, 3) for d in sec] == [0.1, 0.2, 0.3]
    assert "Basis rotation:" in ev.tables[1] and "trigram" in ev.tables[-1]


def test_the_ladder_claims_are_not_run_without_their_folders(tmp_path):
    for claim in ladder.LADDER_CLAIMS:
        assert claim.assess(_ctx(tmp_path)).verdict == "not run", claim.id
        assert "regime: gpt-cpu (415k parameters), 4,000 updates" in claim.primary
