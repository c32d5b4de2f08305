"""The claims report's Grid edges section: the selections still at a grid's edge, read from
each configuration's committed table.md."""

from study import edges

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


def test_every_open_line_the_sweeps_write_is_listed():
    """The sweeps' own lines (experiments.reports.edge_notes), not copies of their words: an
    edge not extended, and an arm where nothing trained (every seed diverged), are both open."""
    from experiments import reports

    def row(method, lr, acc):
        bad = acc is None
        return {"method": method, "lr": lr, "seed": 0, "diverged": bad,
                "final_val_accuracy": None if bad else acc}  # fmt: skip

    rows = [row("sgd", 0.01, 0.5), row("sgd", 0.1, 0.8), row("dana", 0.01, None),
            row("dana", 0.1, None), row("asgd", 0.01, 0.5), row("asgd", 0.03, 0.7),
            row("asgd", 0.1, 0.6)]  # fmt: skip
    text = reports.edge_notes(rows, by=("method",), grid=[0.01, 0.03, 0.1], limit=0,
                              chance_acc=0.1)  # fmt: skip
    lines, interior = edges.edge_lines(text)
    assert len(lines) == 2 and interior == 0, text
    assert any("method sgd" in x and reports.NOT_EXTENDED in x for x in lines)
    assert any("method dana" in x and reports.UNTRAINED in x for x in lines)
    pending = f"- grid extended: method x: lr 1 added; selected 1, {reports.PENDING} (...)."
    assert edges.edge_lines(f"{reports.EDGE_HEAD} (...)\n{pending}\n")[0] == [pending[2:]]
