"""The README's Python examples run, so they never rot."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


# the second block runs two sweeps (12 s): make test-slow; the others stay in make test
@pytest.mark.parametrize(
    "index", [pytest.param(i, marks=pytest.mark.slow) if i == 1 else i for i in range(len(BLOCKS))]
)
def test_readme_example_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write run folders write them here
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), {"__name__": "readme"})
