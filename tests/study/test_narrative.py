"""study/README.md is written by hand from study/claims.md: every decimal number of its result
paragraphs is the report's, so a re-run that changes the report fails here until they are
rewritten."""

import pathlib
import re

STUDY = pathlib.Path(__file__).resolve().parents[2] / "study"
TEXT = (STUDY / "README.md").read_text()


def _numbers_not_in_the_report(part: str, at_least: int) -> list[str]:
    """The decimal numbers of a passage that claims.md does not hold (checking the passage
    still quotes more than ``at_least`` of them)."""
    report = (STUDY / "claims.md").read_text()
    numbers = re.findall(r"(?<![\w.])[−+-]?(\d+\.\d+)", part)
    assert len(numbers) > at_least
    return sorted({n for n in numbers if n not in report})


def test_the_diloco_paragraphs_quote_only_the_reports_numbers():
    part = TEXT[TEXT.index("**The DiLoCo-family claims**") :]
    missing = _numbers_not_in_the_report(part, 20)
    assert not missing, f"not in study/claims.md: {missing}"


def test_the_language_model_paragraphs_quote_only_the_reports_numbers():
    """The LM1–LM6 and LM-M paragraphs after the cost one. Left out: the set-up check of LM2
    ("Before reading that as a finding"), whose numbers are a separate run's table.md."""
    start = TEXT.index("\n\n", TEXT.index("**Their cost, measured**"))
    part = TEXT[start : TEXT.index("**The DiLoCo-family claims**", start)]
    kept = [p for p in part.split("\n\n") if not p.startswith("Before reading that as a finding")]
    assert len(kept) < len(part.split("\n\n"))  # the set-up check is still there, left out
    missing = _numbers_not_in_the_report("\n\n".join(kept), 40)
    assert not missing, f"not in study/claims.md: {missing}"


def test_the_image_claims_paragraphs_quote_only_the_reports_numbers():
    """The paragraphs on the image claims re-run at 27,000 updates (`async`, `pipeline`)."""
    start = TEXT.index("What `async` at 27,000 updates shows")
    part = TEXT[start : TEXT.index("What the digits runs (the experiments' pages) show", start)]
    assert "What `pipeline` at 27,000 updates shows" in part
    missing = _numbers_not_in_the_report(part, 25)
    assert not missing, f"not in study/claims.md: {missing}"
