"""The claims report's Grid edges section: the selections still at a grid's edge, read from
each configuration's committed table.md."""

from experiments.claims import edges

_TABLE = """**Test accuracy**

| a | b |

**Grid edges** (--extend-edges 2: ...)
- grid extended: method asgd, workers 4: lr 0.003 (80.1) added (the selection was at the edge); selected 0.01, now interior.
- grid extended: method sgd, workers 8: lr 0.3 (81.0), 1 (80.0) added (the selection was at the edge); selected 1, **still at the edge after 2 extensions** (the grid's largest; the optimum may lie beyond).
- at the edge, not extended (--extend-edges 2): method dana, workers 8: selected 0.001, every seed diverged above it.

**Two-stage sweep** (...)
- a list item of another paragraph, still at the edge in words only
"""  # noqa: E501


def test_only_selections_still_at_an_edge_are_listed_interior_ones_counted(tmp_path):
    for name, text in (("a", _TABLE), ("b", "**Grid edges** (...)\n- every selected rate is "
                       "interior to its grid.\n"), ("c", "| one rate |\n")):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "table.md").write_text(text)
    lines = edges.section(tmp_path, ["a", "b", "c", "missing"])
    text = "\n".join(lines)
    assert "## Grid edges" in text
    assert "- `a`: 2 selection(s) still at an edge; 1 made interior by extending the grid:" in text
    assert "  - grid extended: method sgd, workers 8" in text
    assert "  - at the edge, not extended (--extend-edges 2): method dana" in text
    assert "method asgd" not in text and "another paragraph" not in text
    assert "- `b`: every selected rate is inside its grid." in text
    assert "- `c`: no rate grid (one rate for every method)." in text
    assert "missing" not in text


def test_no_table_no_section(tmp_path):
    assert edges.section(tmp_path, ["a"]) == []
