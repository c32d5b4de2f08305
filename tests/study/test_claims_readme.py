"""README blocks generated from the claims report (``study/readme.py``)."""

import pytest

import study as claims
from study import readme
from study.core import Verdict

IDS = [c.id for c in claims.CLAIMS]


def _verdicts():
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    return {c.id: Verdict("held" if c.id == "C1" else "within noise", "", [table]) for c in
            claims.CLAIMS}  # fmt: skip


def _ctx(tmp_path):
    return claims.Context(tmp_path, quick=False)


def test_every_block_is_rewritten_and_the_rest_kept(tmp_path):
    text = (
        "intro\n<!-- claims:start -->\n- old\n<!-- claims:end -->\nmiddle\n"
        "<!-- claims:start C1.1 -->\n| old |\n<!-- claims:end C1.1 -->\nend\n"
    )
    readme.check(text, IDS)
    got = readme.rewrite(
        text, readme.blocks(_ctx(tmp_path), claims.CLAIMS, _verdicts(), "docs/claims.md")
    )
    head, table = got.split("middle\n")
    # the headline table: a row a claim linking to its section, its verdict in bold
    assert head.startswith("intro\n<!-- claims:start -->\n| claim | regime | primary ± 95 % CI |")
    assert "| [C1](docs/claims.md#c1) DC-ASGD beats ASGD and SSGD | – |" in head
    assert "**held**" in head and "- old" not in got
    assert "- **Which policy for an 8-stage asynchronous GPT pipeline with AdamW?**" in head
    rows = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert table == f"<!-- claims:start C1.1 -->\n{rows}<!-- claims:end C1.1 -->\nend\n"
    assert (
        readme.rewrite(
            got, readme.blocks(_ctx(tmp_path), claims.CLAIMS, _verdicts(), "docs/claims.md")
        )
        == got
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no markers\n", "needs a <!-- claims:start --> line"),
        ("<!-- claims:start -->\nx\n", "is not closed"),
        ("<!-- claims:start C1.1 -->\n<!-- claims:end -->\n", "closes no open block"),
        ("<!-- claims:start -->\n<!-- claims:start C1.1 -->\n", "is not closed before another"),
        ("<!-- claims:start X9.1 -->\n<!-- claims:end X9.1 -->\n", "unknown block 'X9.1'"),
        ("<!-- claims:start C1 -->\n<!-- claims:end C1 -->\n", "unknown block 'C1'"),
    ],
)
def test_bad_blocks_are_one_error(text, message):
    with pytest.raises(ValueError, match=message):
        readme.check(text, IDS)


def test_a_table_the_report_does_not_have_is_an_error(tmp_path):
    text = "<!-- claims:start C1.2 -->\n<!-- claims:end C1.2 -->\n"
    readme.check(text, IDS)  # the name is well formed ...
    with pytest.raises(ValueError, match="no such table"):  # ... but C1 has one table here
        readme.rewrite(text, readme.blocks(_ctx(tmp_path), claims.CLAIMS, _verdicts(), "r.md"))
