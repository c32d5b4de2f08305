"""study.cells: a sweep's finished cells packed into the repository and restored
on another machine resume it without recomputing, and nothing of other code slips in."""

from __future__ import annotations

import doctest
import json
import lzma

import pytest

import study as claims
from experiments import runs
from study import cells

CONFIG = {"lr": [0.1, 0.3], "steps": 5}
KEYS = [{"lr": lr, "seed": s} for lr in (0.1, 0.3) for s in range(3)]


def _compute(calls):
    def compute(keys):
        calls.append(len(keys))
        return [
            ({"acc": k["lr"] * (k["seed"] + 1), "nan": float("nan")}, [{"step": 1}]) for k in keys
        ]

    return compute


def _sweep(out, keys=KEYS, calls=None, config=CONFIG):
    folder = runs.RunFolder("demo", config, out=out)
    return folder, folder.run_grouped(
        keys, _compute([] if calls is None else calls), vary=("seed",)
    )


def test_an_unfinished_sweep_packed_and_restored_resumes_without_recomputing(tmp_path):
    folder, rows = _sweep(tmp_path / "a" / "demo", KEYS[:3])  # one of two groups finished
    assert cells.pack(tmp_path / "a", tmp_path / "cells", ["demo", "absent"]) == {"demo": (3, 3)}
    assert cells.restore(tmp_path / "cells", tmp_path / "b", ["demo", "absent"]) == {"demo": (3, 0)}
    calls: list[int] = []
    _, resumed = _sweep(tmp_path / "b" / "demo", calls=calls)
    assert calls == [3]  # only the group that had not finished
    assert resumed[:3] == rows and json.dumps(resumed[:3]) == json.dumps(rows)  # field order too
    for name in ("config.json", *(f"cells/{p.name}" for p in (folder.path / "cells").iterdir())):
        assert (tmp_path / "b" / "demo" / name).read_bytes() == (folder.path / name).read_bytes()


def test_packing_appends_only_what_is_new_and_restores_the_latest_version(tmp_path):
    _sweep(tmp_path / "a" / "demo", KEYS[:3])
    box, shards = tmp_path / "cells", lambda: sorted((tmp_path / "cells" / "demo").iterdir())
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (3, 3)}
    first = shards()[0].read_bytes()
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (0, 3)}  # nothing written
    assert [p.name for p in shards()] == [f"0000{cells.SUFFIX}"]
    _sweep(tmp_path / "a" / "demo")  # the other group finishes
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (3, 6)}
    assert shards()[0].read_bytes() == first and len(shards()) == 2
    header, found = cells.read(shards()[1])
    assert header["config"] == CONFIG and len(found) == 3
    assert [f for f, _ in found] == sorted(f for f, _ in found)
    one = sorted((tmp_path / "a" / "demo" / "cells").iterdir())[0]  # re-recorded: a new version
    cell = json.loads(one.read_text())
    one.write_text(runs.to_json({**cell, "row": {**cell["row"], "acc": 9.0}}) + "\n")
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (1, 6)}
    assert cells.restore(box, tmp_path / "b", ["demo"]) == {"demo": (6, 0)}
    assert (tmp_path / "b" / "demo" / "cells" / one.name).read_bytes() == one.read_bytes()


def test_a_run_folders_inputs_travel_with_its_cells_and_only_when_new(tmp_path):
    folder, _ = _sweep(tmp_path / "a" / "demo", KEYS[:3])
    (folder.path / "inputs").mkdir()
    start = bytes(range(256)) * 3  # binary, as an .npz is
    (folder.path / "inputs" / "start.npz").write_bytes(start)
    box = tmp_path / "cells"
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (3, 3)}
    shards = sorted((box / "demo").iterdir())
    assert cells.read_inputs(shards[0]) == {"start.npz": start}
    assert len(cells.read(shards[0])[1]) == 3  # the input line is not a cell
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (0, 3)}  # unchanged: no file
    (folder.path / "inputs" / "start.npz").write_bytes(start[::-1])  # changed: packed again
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (0, 3)}
    assert cells.read_inputs(sorted((box / "demo").iterdir())[1]) == {"start.npz": start[::-1]}
    assert cells.restore(box, tmp_path / "b", ["demo"]) == {"demo": (3, 0)}
    assert (tmp_path / "b" / "demo" / "inputs" / "start.npz").read_bytes() == start[::-1]
    (tmp_path / "b" / "demo" / "inputs" / "start.npz").write_bytes(b"mine")
    cells.restore(box, tmp_path / "b", ["demo"])  # never over a file that exists
    assert (tmp_path / "b" / "demo" / "inputs" / "start.npz").read_bytes() == b"mine"


def test_a_bad_input_entry_is_one_error_before_anything_is_written(tmp_path):
    (tmp_path / "cells" / "demo").mkdir(parents=True)
    for line, match in [
        (b'{"input": "../x", "base64": ""}', "bad input name"),
        (b'{"input": "x", "base64": "***"}', "not base64"),
    ]:
        data = lzma.compress(b'{"config": {"config": {}}}\n' + line + b"\n")
        (tmp_path / "cells" / "demo" / f"0000{cells.SUFFIX}").write_bytes(data)
        with pytest.raises(cells.CellsError, match=match):
            cells.restore(tmp_path / "cells", tmp_path / "b", ["demo"])
        assert not (tmp_path / "b").exists()


def test_restore_never_overwrites_and_refuses_another_configuration(tmp_path):
    _sweep(tmp_path / "a" / "demo")
    cells.pack(tmp_path / "a", tmp_path / "cells", ["demo"])
    _sweep(tmp_path / "b" / "demo", KEYS[:3])
    kept = {p.name: p.read_bytes() for p in (tmp_path / "b" / "demo" / "cells").iterdir()}
    assert cells.restore(tmp_path / "cells", tmp_path / "b", ["demo"]) == {"demo": (3, 0)}
    for name, data in kept.items():
        assert (tmp_path / "b" / "demo" / "cells" / name).read_bytes() == data
    other = runs.RunFolder("demo", {"lr": [9.0]}, out=tmp_path / "c" / "demo")
    other.create()
    before = sorted(p.name for p in (tmp_path / "c").rglob("*"))
    with pytest.raises(cells.CellsError, match="holds another configuration"):
        cells.restore(tmp_path / "cells", tmp_path / "c", ["demo"])
    assert sorted(p.name for p in (tmp_path / "c").rglob("*")) == before


def _other_code():
    return {**runs.code_fingerprint(), "source_sha": "0" * 64}  # as if computed by other code


def test_restored_cells_of_other_code_are_refused_by_the_run_folder(tmp_path):
    folder = runs.RunFolder("demo", CONFIG, out=tmp_path / "a" / "demo", code=_other_code())
    folder.run_grouped(KEYS, _compute([]), vary=("seed",))
    cells.pack(tmp_path / "a", tmp_path / "cells", ["demo"])
    assert cells.restore(tmp_path / "cells", tmp_path / "b", ["demo"]) == {"demo": (6, 0)}
    with pytest.raises(runs.StaleResultsError, match="6 of 6 finished cells"):
        runs.RunFolder("demo", CONFIG, out=tmp_path / "b" / "demo")


def test_one_configuration_at_two_commits_packs_each_once_and_restores_one_code(tmp_path):
    """Two run folders of one configuration under two codes (an older commit's sweep, and the
    one resumed after a code change): each packs its cells once, however often the two are
    packed in turn, and a restore writes one code's cells, never a mix the run folder refuses."""
    box = tmp_path / "cells"
    old = runs.RunFolder("demo", CONFIG, out=tmp_path / "old" / "demo", code=_other_code())
    old.run_grouped(KEYS, _compute([]), vary=("seed",))
    _sweep(tmp_path / "new" / "demo", KEYS[:3])
    for _ in range(2):
        cells.pack(tmp_path / "old", box, ["demo"])
        cells.pack(tmp_path / "new", box, ["demo"])
    assert len(list((box / "demo").iterdir())) == 2  # one file per sweep, no churn
    assert cells.restore(box, tmp_path / "b", ["demo"]) == {"demo": (3, 3)}  # the latest sweep
    calls: list[int] = []
    _sweep(tmp_path / "b" / "demo", calls=calls)  # resumes: no refusal, one group computed
    assert calls == [3]
    runs.RunFolder("demo", CONFIG, out=tmp_path / "c" / "demo", code=_other_code()).create()
    assert cells.restore(box, tmp_path / "c", ["demo"]) == {"demo": (6, 0)}  # its own code's
    runs.RunFolder("demo", CONFIG, out=tmp_path / "d" / "demo", code={"x": 1}).create()
    assert cells.restore(box, tmp_path / "d", ["demo"]) == {"demo": (0, 6)}  # no cell of its
    assert list((tmp_path / "d" / "demo" / "cells").iterdir()) == []


def test_cells_a_run_folder_reused_with_force_resume_are_restored_with_it(tmp_path):
    old = runs.RunFolder("demo", CONFIG, out=tmp_path / "a" / "demo", code=_other_code())
    old.run_grouped(KEYS[:3], _compute([]), vary=("seed",))
    folder = runs.RunFolder("demo", CONFIG, out=tmp_path / "a" / "demo", force_resume=True)
    folder.run_grouped(KEYS, _compute([]), vary=("seed",))  # 3 reused, 3 computed
    cells.pack(tmp_path / "a", tmp_path / "cells", ["demo"])
    assert cells.restore(tmp_path / "cells", tmp_path / "b", ["demo"]) == {"demo": (6, 0)}
    runs.RunFolder("demo", CONFIG, out=tmp_path / "b" / "demo")  # its header accepts them


def test_a_damaged_archive_is_one_error_and_restores_nothing(tmp_path):
    (tmp_path / "cells" / "demo").mkdir(parents=True)
    (tmp_path / "cells" / "demo" / f"0000{cells.SUFFIX}").write_bytes(b"not xz")
    with pytest.raises(cells.CellsError, match="not a cells archive"):
        cells.restore(tmp_path / "cells", tmp_path / "b", ["demo"])
    bad = lzma.compress(b'{"config": {}}\n{"file": "../x.json", "cell": {}}\n')
    (tmp_path / "cells" / "demo" / f"0000{cells.SUFFIX}").write_bytes(bad)
    with pytest.raises(cells.CellsError, match="bad entries"):
        cells.restore(tmp_path / "cells", tmp_path / "b", ["demo"])
    assert not (tmp_path / "b").exists()


def test_the_command_line_packs_and_restores_the_claims_configurations(tmp_path, capsys):
    declared = claims.RUNS["async"].config.resolved()  # what --restore asks the archive for
    _sweep(tmp_path / "res" / "async", config=declared)  # a run folder of a configuration
    out, box = tmp_path / "docs" / "claims.md", tmp_path / "docs" / "claims" / "cells"
    got = claims.main(["--pack", "--results", str(tmp_path / "res"), "--out", str(out)])
    assert got["text"] is None and not out.exists()
    assert sorted(p.name for p in (box / "async").iterdir()) == [f"0000{cells.SUFFIX}"]
    assert "async: packed 6 new cells, 6 in all" in capsys.readouterr().err
    claims.main(["--restore", "--results", str(tmp_path / "new"), "--cells", str(box)])
    assert len(list((tmp_path / "new" / "async" / "cells").iterdir())) == 6
    assert "async: restored 6 cells (" in capsys.readouterr().err
    other = runs.RunFolder("async", declared, out=tmp_path / "res2" / "async", code=_other_code())
    other.run_grouped(KEYS[:3], _compute([]), vary=("seed",))  # a later sweep, other code
    claims.main(["--pack", "--results", str(tmp_path / "res2"), "--out", str(out)])
    claims.main(["--restore", "--results", str(tmp_path / "new2"), "--cells", str(box)])
    err = capsys.readouterr().err
    assert "async: restored 3 cells, left out 3 archived cells of other code" in err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--pack", "--run"], "--run"),
        (["--pack", "--restore"], "--restore"),
        (["--pack", "--from-rows"], "--from-rows"),
        (["--restore", "--quick"], "--quick"),
        (["--restore", "--force-resume"], "--force-resume"),
        (["--cells", "x"], "--cells"),
    ],
)
def test_packing_flags_that_would_be_ignored_are_one_line_errors(argv, flag, tmp_path, capsys):
    with pytest.raises(SystemExit):
        claims.main([*argv, "--results", str(tmp_path / "r"), "--out", str(tmp_path / "x.md")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {flag}" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_configuration_swept_again_under_its_name_keeps_both_archives_apart(tmp_path):
    """The code's configuration changed (a larger budget): its new sweep is packed after the old
    one under the same name, each configuration's files hold its own cells, and restore picks
    the run folder's configuration, else the one asked for, else the latest."""
    _sweep(tmp_path / "a" / "demo")
    box = tmp_path / "cells"
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (6, 6)}
    new = {**CONFIG, "steps": 15}
    folder = runs.RunFolder("demo", new, out=tmp_path / "n" / "demo")
    folder.run_grouped(KEYS[:3], _compute([]), vary=("seed",))
    assert cells.pack(tmp_path / "n", box, ["demo"]) == {"demo": (3, 3)}  # not 3 of 9
    assert cells.pack(tmp_path / "n", box, ["demo"]) == {"demo": (0, 3)}  # nothing new
    assert cells.pack(tmp_path / "a", box, ["demo"]) == {"demo": (0, 6)}  # the old one's too
    assert len(list((box / "demo").iterdir())) == 2
    assert cells.restore(box, tmp_path / "latest", ["demo"]) == {"demo": (3, 3)}
    assert cells.restore(box, tmp_path / "old", ["demo"], want={"demo": CONFIG}) == {"demo": (6, 0)}
    back = runs.RunFolder("demo", CONFIG, out=tmp_path / "old" / "demo")  # resumes: no refusal
    assert len(back.run_grouped(KEYS, _compute(calls := []), vary=("seed",))) == 6 and not calls
    # a run folder of the new configuration resumes from the new cells, whatever is asked
    assert cells.restore(box, tmp_path / "n", ["demo"], want={"demo": CONFIG}) == {"demo": (0, 3)}
    # a configuration changed since its last sweep (none archived): nothing is restored, and
    # its run starts in the folder, where the old sweep's config.json would have refused it
    changed = {**CONFIG, "steps": 45}
    got = cells.restore(box, tmp_path / "m", ["demo"], want={"demo": changed})
    assert got == {"demo": (0, 6)} and not (tmp_path / "m" / "demo").exists()
    runs.RunFolder("demo", changed, out=tmp_path / "m" / "demo").create()
    other = runs.RunFolder("demo", {"lr": [9.0]}, out=tmp_path / "c" / "demo")
    other.create()
    with pytest.raises(cells.CellsError, match="holds another configuration"):
        cells.restore(box, tmp_path / "c", ["demo"])


def test_the_modules_examples_run():
    assert doctest.testmod(cells, optionflags=doctest.ELLIPSIS).failed == 0
