"""README blocks generated from the claims report (``python -m study --readme``).

A block is the lines between ``<!-- claims:start NAME -->`` and ``<!-- claims:end NAME -->``
(each marker on its own line; ``NAME`` left out for the verdict list):

* the headline (no name): the report's headline table, one row a claim linking to its
  section, and its answers to the practitioner's questions (:mod:`~study.headline`);
* ``C1.1``, ``P1.2``, …: the claim's first, second, … table, as the report prints it.

Every block found is rewritten from the report's verdicts; text outside the blocks is left as
it is, so the README says only what the report says where it quotes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from . import headline
from .core import Claim, Context, Verdict

__all__ = ["blocks", "check", "rewrite"]

_MARK = re.compile(r"^<!-- claims:(start|end)(?: (\S+))? -->$", re.M)


def blocks(
    ctx: Context, claims: Sequence[Claim], verdicts: Mapping[str, Verdict], report_link: str
) -> dict[str, list[str]]:
    """Every block this report can fill, by name (``report_link``: the report's path from the
    README)."""
    # the README's table holds the claims with a verdict; those declared but not run yet are
    # one line under it (the report's headline lists them all)
    ran = [c for c in claims if verdicts[c.id].label != "not run"]
    table = headline.table(ctx, ran, verdicts, report_link).splitlines()
    if waiting := [c for c in claims if verdicts[c.id].label == "not run"]:
        links = ", ".join(f"[{c.id}]({report_link}#{c.id.lower()})" for c in waiting)
        table += ["", f"Declared, not run yet (their primaries are in the report): {links}."]
    out = {"": [*table, "", *headline.questions(ctx)]}
    for c in claims:
        for i, table in enumerate(verdicts[c.id].tables, 1):
            out[f"{c.id}.{i}"] = table.splitlines()
    return out


def _spans(text: str) -> list[tuple[str, int, int]]:
    """``(name, end of the start marker, start of the end marker)`` of every block.

    Raises:
        ValueError: no block, or markers that do not pair up.
    """
    spans, open_ = [], None
    for m in _MARK.finditer(text):
        kind, name = m.group(1), m.group(2) or ""
        if kind == "start":
            if open_ is not None:
                raise ValueError(f"block {open_[0] or '(verdicts)'} is not closed before another")
            open_ = (name, m.end())
        else:
            if open_ is None or open_[0] != name:
                raise ValueError(f"an end marker {name!r} closes no open block of that name")
            spans.append((name, open_[1], m.start()))
            open_ = None
    if open_ is not None:
        raise ValueError(f"block {open_[0] or '(verdicts)'} is not closed")
    if not spans:
        raise ValueError("needs a <!-- claims:start --> line and its <!-- claims:end --> line")
    return spans


def check(text: str, claim_ids: Sequence[str]) -> None:
    """Raises ValueError unless every block of ``text`` pairs up and has a name this report
    can fill (the verdicts, or ``<claim>.<k>``)."""
    for name, _, _ in _spans(text):
        cid, _, k = name.partition(".")
        if name and not (cid in claim_ids and k.isdigit() and int(k) >= 1):
            raise ValueError(f"unknown block {name!r} (the verdicts, or <claim>.<k>: C1.1, …)")


def rewrite(text: str, filled: Mapping[str, Sequence[str]]) -> str:
    """``text`` with each block's lines replaced by ``filled[name]``.

    Raises:
        ValueError: as :func:`check`, or a block this report has no content for (a claim with
            fewer tables).
    """
    out, last = [], 0
    for name, a, b in _spans(text):
        if name not in filled:
            raise ValueError(f"block {name!r}: the report has no such table")
        out += [text[last:a], "\n", "\n".join(filled[name]), "\n"]
        last = b
    return "".join([*out, text[last:]])
