"""Every benchmark runs as ``python benchmarks/<name>.py`` (``make bench``): a script that
imports from ``benchmarks`` puts the checkout on ``sys.path`` before it does."""

import ast
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[2] / "benchmarks").glob("[!_]*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_the_checkout_is_on_the_path_before_benchmarks_is_imported(path):
    tree = ast.parse(path.read_text())
    guard, first_import = None, None
    for node in tree.body:
        if isinstance(node, ast.If) and "sys.path.insert" in ast.unparse(node):
            guard = guard or node.lineno
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
            first_import = first_import or node.lineno
    if first_import is not None:
        assert guard is not None and guard < first_import, f"{path.name}: no sys.path guard first"


def test_every_script_is_found():
    assert len(SCRIPTS) >= 10 and all(not p.name.startswith("_") for p in SCRIPTS)
