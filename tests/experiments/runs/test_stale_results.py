"""RunFolder and code fingerprints: a resumed run never silently mixes results of different code."""

import argparse
import json

import pytest

from experiments import runs
from experiments.runs import RunFolder, StaleResultsError


def _build(hp):
    return hp * 2


def _build_changed(hp):
    return hp * 3


def _fp(*sources):
    return runs.code_fingerprint(sources=sources)


def _keys():
    return [{"method": "m", "seed": s} for s in range(3)]


def _counting(calls):
    def fn(key):
        calls.append(key)
        return {"final_test_accuracy": 0.5, "diverged": False}, [{"step": 1, "loss": 1.0}]

    return fn


def test_same_code_resumes(tmp_path):
    calls = []
    RunFolder("exp", {"a": 1}, out=tmp_path / "r", code=_fp(_build)).run(_keys(), _counting(calls))
    assert len(calls) == 3
    again = RunFolder("exp", {"a": 1}, out=tmp_path / "r", code=_fp(_build))
    again.run(_keys(), _counting(calls))
    assert len(calls) == 3 and again.reused_cells == 0
    cell = json.loads(next((tmp_path / "r" / "cells").glob("*.json")).read_text())
    assert cell["code"] == again.code_hash == runs.code_hash(_fp(_build))
    stored = json.loads((tmp_path / "r" / "config.json").read_text())
    assert stored["code"] == {**_fp(_build), "hash": again.code_hash}
    assert "force_resumed" not in stored and "code_history" not in stored


def test_changed_user_source_is_refused_before_computing(tmp_path):
    out = tmp_path / "r"
    RunFolder("exp", {"a": 1}, out=out, code=_fp(_build)).run(_keys()[:2], _counting([]))
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(StaleResultsError) as info:
        RunFolder("exp", {"a": 1}, out=out, code=_fp(_build_changed))
    msg = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in msg
    assert "2 of 2 finished cells" in msg and "changed: user sources" in msg
    assert "--force-resume" in msg and "another --out" in msg and f"delete {out}" in msg
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_force_resume_reuses_old_cells_and_records_it(tmp_path, capsys):
    out = tmp_path / "r"
    old_fp, new_fp = _fp(_build), _fp(_build_changed)
    RunFolder("exp", {"a": 1}, out=out, code=old_fp).run(_keys()[:2], _counting([]))
    calls = []
    run = RunFolder("exp", {"a": 1}, out=out, code=new_fp, force_resume=True)
    assert "reusing 2 cells" in capsys.readouterr().err
    rows = run.run(_keys(), _counting(calls))
    assert calls == _keys()[2:] and len(rows) == 3 and run.reused_cells == 2
    stored = json.loads((out / "config.json").read_text())
    assert stored["code"]["hash"] == runs.code_hash(new_fp)
    assert stored["code_history"] == [{**old_fp, "hash": runs.code_hash(old_fp)}]
    [event] = stored["force_resumed"]
    assert event["reused_cells"] == 2 and event["changed"] == ["user sources"]
    assert event["from"] == [runs.code_hash(old_fp)] and event["to"] == runs.code_hash(new_fp)
    hashes = sorted(json.loads(p.read_text())["code"] for p in (out / "cells").glob("*.json"))
    # what the header accepts, read by the folder and by the claims archive (one helper)
    assert runs.accepted_codes(stored) == {runs.code_hash(old_fp), runs.code_hash(new_fp)}
    elsewhere = {**stored, "code": {"hash": "third"}}  # reuse recorded into another code
    assert runs.accepted_codes(elsewhere) == {"third"}
    assert runs.accepted_codes({}) == {None}
    assert hashes == sorted([runs.code_hash(old_fp)] * 2 + [runs.code_hash(new_fp)])
    # the decision is recorded: the same code resumes without the flag ...
    RunFolder("exp", {"a": 1}, out=out, code=new_fp).run(_keys(), _counting(calls))
    assert len(calls) == 1
    # ... but code that changed once more is refused again
    with pytest.raises(StaleResultsError, match="3 of 3"):
        RunFolder("exp", {"a": 1}, out=out, code=_fp(_build, _build_changed))


def test_folder_of_old_code_without_fingerprint_is_stale(tmp_path):
    out = tmp_path / "r"
    RunFolder("exp", {"a": 1}, out=out).run(_keys()[:1], _counting([]))
    header = json.loads((out / "config.json").read_text())
    del header["code"]  # as written before fingerprints existed
    (out / "config.json").write_text(json.dumps(header))
    for p in (out / "cells").glob("*.json"):
        cell = json.loads(p.read_text())
        del cell["code"]
        p.write_text(json.dumps(cell))
    with pytest.raises(StaleResultsError, match="no code fingerprint recorded"):
        RunFolder("exp", {"a": 1}, out=out)
    RunFolder("exp", {"a": 1}, out=out, force_resume=True).run(_keys()[:1], _counting([]))


def test_a_new_git_commit_alone_keeps_the_cells(tmp_path):
    fp = _fp(_build)
    RunFolder("exp", {}, out=tmp_path / "r", code=fp).run(_keys(), _counting([]))
    calls = []
    other = {**fp, "git_commit": "0" * 40}
    RunFolder("exp", {}, out=tmp_path / "r", code=other).run(_keys(), _counting(calls))
    assert calls == []


def test_from_args_reads_out_and_force_resume_and_exits_cleanly(tmp_path, capsys):
    out = tmp_path / "r"
    args = runs.cli_parser("x").parse_args(["--out", str(out)])
    run = RunFolder.from_args("exp", {"a": 1}, args, modules=[__file__], sources=[_build])
    assert run.path == out and run.code["experiment_sha"] is not None
    run.run(_keys(), _counting([]))
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        RunFolder.from_args("exp", {"a": 1}, args, modules=[__file__], sources=[_build_changed])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("exp: error: ") and "--force-resume" in line
    forced = argparse.Namespace(out=str(out), force_resume=True)
    again = RunFolder.from_args(
        "exp", {"a": 1}, forced, modules=[__file__], sources=[_build_changed]
    )
    assert again.reused_cells == 3
