"""A sweep killed mid-way, one of its cell files damaged, then resumed, writes the table.md of an
uninterrupted run byte for byte — for every method family of async_workers and every weight
policy of pipeline_staleness. The resume recomputes the damaged cell in the group (vmapped lanes)
a fresh run gives it (``RunFolder.run_grouped``), so this holds even where XLA rounds a lane by
its company (gap-aware: ``jaxstale.loop``, "Compiled steps").

All ``slow`` (``make test-slow``): the pipeline's vanilla policy and LC-ASGD (the reported
defects), every other family and policy.
"""

import json

import pytest

from experiments import async_workers
from experiments import pipeline_staleness as pipe
from experiments.runs.groups import TIMING_FIELDS

ASYNC = ["--steps", "24", "--seeds", "2", "--workers", "2,4", "--lrs", "0.01"]
ASYNC += ["--batch-size", "16", "--momentum", "0.9"]
PIPE = ["--model", "mlp", "--stages", "2", "--seeds", "2", "--steps", "16", "--lrs", "0.003,0.01"]
PIPE += ["--extend-edges", "0"]  # the grid as given: test_grid_edges resumes an extended one

#: async_workers families, each with a second group so that the kill leaves one group done
FAMILIES = {
    "asgd": "sgd,ssgd,asgd,sa-asgd",
    "dc-asgd": "dc-asgd-c,dc-asgd-a",
    "gap-aware": "gap-aware,asgd",
    "lc-asgd": "lc-asgd,asgd",
    "dana": "dana,dana-dc",
}
POLICIES = ["sync", "vanilla", "stash", "spectrain-v1", "spectrain-v2", "nesterov"]


def _rows(folder):
    rows = json.loads((folder / "summary.json").read_text())["rows"]
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def _kill_damage_resume(main, argv, tmp_path, monkeypatch, owner, name):
    """Runs ``main`` uninterrupted, then again killed (Ctrl-C) in its second group, damages a
    finished cell's file, resumes; the resumed folder's table and rows are the first run's."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    main([*argv, "--out", str(whole)])
    real, calls = getattr(owner, name), []

    def killed(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, killed)
    with pytest.raises(SystemExit) as info:
        main([*argv, "--out", str(part)])
    assert info.value.code == 130
    monkeypatch.setattr(owner, name, real)
    cells = sorted((part / "cells").glob("*.json"))
    assert cells and not (part / "table.md").exists()
    cells[0].write_text(cells[0].read_text()[:60])  # cut mid-write
    main([*argv, "--out", str(part)])
    assert (part / "table.md").read_bytes() == (whole / "table.md").read_bytes()
    assert _rows(part) == _rows(whole)


def _family(family, tmp_path, monkeypatch):
    lam = ["--lc-lambdas", "0.1"] if family == "lc-asgd" else []
    argv = [*ASYNC, *lam, "--methods", FAMILIES[family]]
    _kill_damage_resume(
        async_workers.main, argv, tmp_path, monkeypatch, async_workers, "_run_group"
    )


def _policy(policy, tmp_path, monkeypatch):
    argv = [*PIPE, "--methods", f"{policy},{'sync' if policy != 'sync' else 'vanilla'}"]
    _kill_damage_resume(pipe.main, argv, tmp_path, monkeypatch, pipe._Runner, "group")


@pytest.mark.slow  # 10 s; tests/runs/test_resume_groups.py keeps the group recompute in make test
def test_async_workers_lc_asgd_resumes_to_the_same_table(tmp_path, monkeypatch):
    _family("lc-asgd", tmp_path, monkeypatch)


@pytest.mark.slow  # long: three sweeps per family, each compiling its methods; `make test-slow`
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "lc-asgd"])
def test_async_workers_family_resumes_to_the_same_table(family, tmp_path, monkeypatch):
    _family(family, tmp_path, monkeypatch)


@pytest.mark.slow  # 10 s; tests/runs/test_resume_groups.py keeps the group recompute in make test
def test_pipeline_vanilla_resumes_to_the_same_table(tmp_path, monkeypatch):
    _policy("vanilla", tmp_path, monkeypatch)


@pytest.mark.slow  # long: three sweeps per policy, each compiling its rounds; `make test-slow`
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "vanilla"])
def test_pipeline_policy_resumes_to_the_same_table(policy, tmp_path, monkeypatch):
    _policy(policy, tmp_path, monkeypatch)
