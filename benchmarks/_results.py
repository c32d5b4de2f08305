"""Where the benchmarks' markdown tables are written: ``<out>/<name>.md``, by default
``benchmarks/results/``."""

from __future__ import annotations

import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def write(name: str, text: str, out: str | None = None) -> str:
    """Writes ``text`` (and a final newline) to ``<out or RESULTS>/<name>.md``; returns the
    path."""
    folder = out or RESULTS
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.md")
    with open(path, "w") as fh:
        fh.write(text + "\n")
    return path
