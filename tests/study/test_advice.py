"""The headline's answer column (``study/advice.py``): one sentence for each way a claim's
verdict can point, chosen by the verdict; no call where it makes none."""

import pytest

from study import advice as A
from study.core import Verdict
from study.registry import CLAIMS


def test_every_claim_has_an_answer_both_ways_and_no_answer_names_an_unknown_claim():
    ids = [c.id for c in CLAIMS]
    assert set(A.ADVICE) == set(ids)
    for claim, (yes, no) in A.ADVICE.items():
        assert yes and no and yes != no, claim
        assert len(yes) <= 100 and len(no) <= 100, claim  # one line of the table


@pytest.mark.parametrize(
    ("label", "want"),
    [
        ("held", 0),
        ("held with reversals", 0),
        ("reached", 0),
        ("did not hold", 1),
        ("not reached", 1),
    ],
)
def test_the_verdict_picks_the_sentence(label, want):
    got = A.advice("LM3", label, "2bw (N=8) worse than sync (N=8) by more than the margin")
    assert got.startswith(A.ADVICE["LM3"][want])
    assert got.endswith("(a secondary reversed)") == (label == "held with reversals")


def test_a_verdict_that_makes_no_call_says_so_with_the_comparison():
    for label in ("within noise", "suggestive", "doubtful", "untestable here"):
        assert A.advice("C1", label, "a ≈ b (within ±1 points)") == (
            "no call: a ≈ b (within ±1 points)"
        )
    # the mechanical answer of an untestable verdict already says "no call"
    v = Verdict("untestable here (MDE 2 vs expected 1 points)", "")
    assert A.advice("C1", v.label, "no call: the runs cannot resolve it") == (
        "no call: the runs cannot resolve it"
    )
    assert A.advice("LM7", "not run", "–") == "–"


def test_the_headline_prints_the_chosen_sentence():
    # the committed report: a claim that did not hold reads its 'against' sentence
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "study" / "claims.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| [LM3]"))
    assert "**did not hold**" in row and A.ADVICE["LM3"][1] in row
