"""The smoke-run budget: every experiment's ``--quick`` on every built-in dataset, timed.

A ``--quick`` run is what a new user runs first, and what tells a working setup from a broken
one; each should take under two minutes on a 2-core CPU. This script runs each experiment's
``--quick`` on each dataset that ships with the package or is generated offline (``digits``,
``mnist1d``, ``shakespeare``; an experiment that generates its own task, once: ``own``), each
in a fresh process (compile included, as a user meets
it), and writes ``benchmarks/results/quick_budget.md``: wall time, exit status, and the one
line of an experiment that refuses a dataset. ``tests/benchmarks/test_quick_budget.py``
checks the committed table covers every experiment and dataset; no test asserts a time.

Usage: ``python benchmarks/quick_budget.py [--only EXPERIMENT,...] [--datasets NAME,...]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._results import RESULTS, write

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("digits", "mnist1d", "shakespeare")
#: experiments whose question is about images only: on a text they get no GPT, and refuse
IMAGES_ONLY = ("async_bn",)
#: experiments that generate their own task (no --dataset): measured once, as dataset "own"
OWN_TASK = ("stale_rl",)
BUDGET_S = 120


def experiments() -> list[str]:
    from jaxstale import cli

    return sorted(n for n in cli.experiments() if n != "claims")


def datasets_of(name: str, datasets: Sequence[str] = DATASETS) -> list[str]:
    """The datasets an experiment's smoke run is measured on."""
    return ["own"] if name in OWN_TASK else list(datasets)


def _argv(name: str, dataset: str, out: str) -> list[str]:
    argv = [sys.executable, "-m", f"experiments.{name}", "--quick"]
    if dataset != "own":
        argv += ["--dataset", dataset]
    if dataset == "shakespeare" and name not in IMAGES_ONLY:
        argv += ["--model", "gpt-tiny"]
    return [*argv, "--out", out]


def measure(name: str, dataset: str) -> tuple[float, int, str]:
    """``(wall seconds, exit status, last stderr line)`` of one ``--quick`` run."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        res = subprocess.run(
            _argv(name, dataset, os.path.join(tmp, "run")),
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        wall = time.perf_counter() - start
    lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
    return wall, res.returncode, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="experiments (comma-separated)")
    p.add_argument("--datasets", default=",".join(DATASETS), help="datasets (comma-separated)")
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else experiments()
    # a partial run (--only, --datasets) replaces its rows of the committed table, keeps the rest
    old = Path(RESULTS) / "quick_budget.md"
    kept = {}
    if old.exists():
        for line in old.read_text().splitlines():
            if m := re.match(r"^\| `(\w+)` \| (\w+) \|", line):
                kept[(m[1], m[2])] = line
    rows = []
    for name in names:
        for dataset in datasets_of(name, args.datasets.split(",")):
            wall, code, last = measure(name, dataset)
            if code == 0:
                verdict = "yes" if wall < BUDGET_S else "**no**"
                note = ""
            elif code == 2:
                verdict, note = "refused", last.split("error: ", 1)[-1]
            else:
                verdict, note = f"**failed ({code})**", last
            kept[(name, dataset)] = f"| `{name}` | {dataset} | {wall:.0f} | {verdict} | {note} |"
            print(kept[(name, dataset)], flush=True)
    rows = [kept[k] for k in sorted(kept)]
    text = "\n".join(
        [
            "**Smoke-run budget** (`benchmarks/quick_budget.py`): `python -m experiments.<name> "
            "--quick --dataset <d>` (text: `--model gpt-tiny`), one fresh process each, compile "
            f"included; wall seconds on this machine ({os.cpu_count()} CPUs); under "
            f"{BUDGET_S} s: the budget. A refusal is the experiment's one line.",
            "",
            "| experiment | dataset | wall (s) | under 2 min | note |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    path = write("quick_budget", text)
    print(path)
    return text


if __name__ == "__main__":
    main()
