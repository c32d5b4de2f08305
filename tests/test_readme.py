"""The README and the guides: their Python examples run (so they never rot), their relative
links point at files that exist, and the README stays a page a newcomer reads in minutes."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: every page whose examples are tested: the README, the Sphinx site's Markdown pages, the study's
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "study" / "README.md"]
PAGES = [p for p in PAGES if "_build" not in p.parts]
#: design.md's blocks are sketches of interfaces, not examples
BLOCKS = [
    (page, i, block)
    for page in PAGES
    if page.name != "design.md"
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]


def _name(page: pathlib.Path, i: int) -> str:
    return f"{page.relative_to(ROOT)}[{i}]"


def test_readme_is_short_and_has_examples():
    text = README.read_text()
    assert text.count("\n") <= 200
    assert sum(1 for page, _, _ in BLOCKS if page == README) >= 2


def _slow(block: str) -> bool:
    """Blocks that run a sweep (``.main(``: 12 s) or train a GPT (a compile of ~8 s; the RL
    tutorial's 20 s) are make test-slow; the others stay in make test."""
    return ".main(" in block or '"shakespeare"' in block or '"gpt-tiny"' in block


@pytest.mark.parametrize(
    "page_block",
    [
        pytest.param((p, b), id=_name(p, i), marks=[pytest.mark.slow] if _slow(b) else [])
        for p, i, b in BLOCKS
    ],
)
def test_example_runs(page_block, tmp_path, monkeypatch):
    page, block = page_block
    monkeypatch.chdir(tmp_path)  # examples that write run folders write them here
    exec(compile(block, f"{page.name}[python block]", "exec"), {"__name__": "readme"})


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page):
    """Sphinx does not check links to repository files outside docs/ (docs/conf.py), and the
    repository's web page shows every page: each relative link must name a file or folder."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.partition("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
