"""The smoke-run budget table (``benchmarks/quick_budget.py``): the committed table measures
every experiment's ``--quick`` on every built-in dataset, and the script's command lines are
the ones a user types. No time is asserted here: the table records what was measured."""

import re
from pathlib import Path

from benchmarks import quick_budget

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "quick_budget.md"


def _rows() -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in TABLE.read_text().splitlines():
        m = re.match(r"^\| `(\w+)` \| (\w+) \| (\d+) \| ([^|]+) \| (.*) \|$", line)
        if m:
            rows[(m[1], m[2])] = [m[3], m[4].strip(), m[5].strip()]
    return rows


def test_the_committed_table_covers_every_experiment_on_every_built_in_dataset():
    rows = _rows()
    want = {(e, d) for e in quick_budget.experiments() for d in quick_budget.datasets_of(e)}
    assert want <= set(rows), sorted(want - set(rows))
    for key, (_, verdict, note) in rows.items():
        # a run either finished (its verdict says whether within the budget) or was refused in
        # the experiment's one line: never a crash
        assert verdict in ("yes", "**no**", "refused"), (key, verdict, note)
        assert verdict != "refused" or note, key


def test_the_command_lines_are_a_users():
    argv = quick_budget._argv("pipeline_staleness", "shakespeare", "/tmp/x")
    assert argv[1:] == [
        "-m", "experiments.pipeline_staleness", "--quick", "--dataset", "shakespeare",
        "--model", "gpt-tiny", "--out", "/tmp/x",
    ]  # fmt: skip
    assert "--model" not in quick_budget._argv("async_workers", "digits", "/tmp/x")
    assert "--dataset" not in quick_budget._argv("stale_rl", "own", "/tmp/x")  # its own task
