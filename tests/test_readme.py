"""The README's Python examples run, so they never rot."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


#: blocks that run a sweep (``.main(``: 12 s) or train the GPT (a compile of ~8 s) are
#: make test-slow; the others stay in make test
SLOW = [i for i, b in enumerate(BLOCKS) if ".main(" in b or '"shakespeare"' in b]


@pytest.mark.parametrize(
    "index",
    [pytest.param(i, marks=pytest.mark.slow) if i in SLOW else i for i in range(len(BLOCKS))],
)
def test_readme_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write run folders write them here
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {"__name__": "readme"})


def _numbers_not_in_the_report(part: str, at_least: int) -> list[str]:
    """The decimal numbers of a hand-written README passage that study/claims.md does not hold
    (checking the passage still quotes more than ``at_least`` of them)."""
    report = (README.parent / "study" / "claims.md").read_text()
    numbers = re.findall(r"(?<![\w.])[−+-]?(\d+\.\d+)", part)
    assert len(numbers) > at_least
    return sorted({n for n in numbers if n not in report})


def test_the_diloco_paragraphs_quote_only_the_reports_numbers():
    """README's D1–D7 paragraphs are written by hand from study/claims.md: every decimal number
    in them is the report's, so a re-run that changes the report fails here until they are
    rewritten."""
    text = README.read_text()
    start = text.index("**The DiLoCo-family claims**")
    part = text[start : text.index("\n### ", start)]
    missing = _numbers_not_in_the_report(part, 20)
    assert not missing, f"not in study/claims.md: {missing}"


def test_the_language_model_paragraphs_quote_only_the_reports_numbers():
    """README's LM1–LM6 and LM-M paragraphs after the cost one are written by hand from
    study/claims.md, as the DiLoCo ones are: every decimal number in them is the report's, so a
    re-run that changes the report (the batch-16 re-run of the pipeline configurations) fails
    here until they are rewritten. Left out: the set-up check of LM2 ("Before reading that as a
    finding"), whose numbers are a separate run's and the run folder's table.md."""
    text = README.read_text()
    start = text.index("**Their cost, measured**")
    start = text.index("\n\n", start)
    part = text[start : text.index("**The DiLoCo-family claims**", start)]
    kept = [p for p in part.split("\n\n") if not p.startswith("Before reading that as a finding")]
    assert len(kept) < len(part.split("\n\n"))  # the set-up check is still there, left out
    missing = _numbers_not_in_the_report("\n\n".join(kept), 40)
    assert not missing, f"not in study/claims.md: {missing}"


def test_the_image_claims_paragraphs_quote_only_the_reports_numbers():
    """README's paragraphs on the image claims re-run at 27,000 updates (`async`, `pipeline`)
    are written by hand from study/claims.md, as the DiLoCo and LM ones are."""
    text = README.read_text()
    start = text.index("What `async` at 27,000 updates shows")
    part = text[start : text.index("What the digits runs below show", start)]
    assert "What `pipeline` at 27,000 updates shows" in part
    missing = _numbers_not_in_the_report(part, 25)
    assert not missing, f"not in study/claims.md: {missing}"
