"""Run folders: ordinary file modes, a clean Ctrl-C, bad --out refused before writing."""

import os
import stat

import pytest

from experiments import runs
from experiments.runs import RunFolder, RunFolderError


def _cell(key):
    return {"final_test_accuracy": 0.5, "diverged": False}, [{"step": 1, "loss": 1.0}]


def _keys(n=4):
    return [{"model": "mlp", "seed": s} for s in range(n)]


@pytest.mark.parametrize(
    "umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)]
)
def test_files_and_folders_get_the_umask_modes(tmp_path, umask, file_mode, dir_mode):
    from matplotlib.figure import Figure

    old = os.umask(umask)
    try:
        run = RunFolder("exp", {"u": umask}, out=tmp_path / "a" / "r")
        run.run(_keys(), _cell)
        fig = Figure()
        fig.subplots().plot([0, 1])
        run.finish("| t |", {"plot": fig})
        runs.atomic_write_text(run.path / "extra.json", "{}\n")
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "a").rglob("*") if p.is_file()]
    dirs = [tmp_path / "a", *(p for p in (tmp_path / "a").rglob("*") if p.is_dir())]
    assert len(files) == 4 + 6 and len(dirs) == 3  # 4 cells; config, metrics, summary, ...
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(file_mode)}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in dirs} == {oct(dir_mode)}


def test_ctrl_c_in_run_grouped_saves_prints_one_line_and_exits_130(tmp_path, capsys):
    calls = []

    def fn(keys):
        calls.append(keys)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [_cell(k) for k in keys]

    run = RunFolder("exp", {}, out=tmp_path / "r")
    keys = [{"model": m, "seed": s} for m in ("mlp", "cnn") for s in range(2)]
    with pytest.raises(SystemExit) as info:
        run.run_grouped(keys, fn, vary=("seed",))
    assert info.value.code == 130
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no traceback chain
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"interrupted: 2 cells saved in {run.path}; re-run the same command to resume"
    )
    assert len(run.rows()) == 2
    calls.clear()
    RunFolder("exp", {}, out=tmp_path / "r").run_grouped(keys, lambda ks: [_cell(k) for k in ks])
    assert len(RunFolder("exp", {}, out=tmp_path / "r").rows()) == 4


def test_ctrl_c_counts_the_cells_of_every_call_into_the_folder(tmp_path, capsys):
    """A sweep fills one folder over several calls (one per worker count, model, ...): Ctrl-C in
    a later call said "0/6 cells saved" with the earlier calls' cells on disk (issue 51)."""
    run = RunFolder("exp", {}, out=tmp_path / "r")
    run.run_grouped([{"m": 4, "seed": s} for s in range(3)], lambda ks: [_cell(k) for k in ks])

    def stop(keys):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit):
        run.run_grouped([{"m": 8, "seed": s} for s in range(3)], stop)
    assert capsys.readouterr().err.splitlines()[-1].startswith("interrupted: 3 cells saved in ")


def test_a_ctrl_c_that_a_callback_swallowed_stops_the_sweep_after_its_group(tmp_path, capsys):
    """Python raises KeyboardInterrupt where the signal lands; inside a garbage-collector
    callback (jax's) it is printed and lost, and the sweep ran to its end (issue 51)."""
    import signal

    calls = []

    def fn(keys):
        calls.append(keys)
        try:  # what a gc callback does with the exception: "Exception ignored", then on
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return [_cell(k) for k in keys]

    run = RunFolder("exp", {}, out=tmp_path / "r")
    keys = [{"model": m, "seed": s} for m in ("mlp", "cnn") for s in range(2)]
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest-xdist ignores it
    try:
        with pytest.raises(SystemExit) as info:
            run.run_grouped(keys, fn, vary=("seed",))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, old)
    assert info.value.code == 130 and len(calls) == 1 and len(run.rows()) == 2
    assert "interrupted: 2 cells saved" in capsys.readouterr().err


def test_ctrl_c_before_any_cell_leaves_no_folder(tmp_path, capsys):
    def fn(key):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit):
        RunFolder("exp", {}, out=tmp_path / "r").run(_keys(), fn)
    assert "interrupted: 0 cells saved" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_out_that_is_a_file_is_refused_and_nothing_written(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunFolderError, match=r"^--out .*f is an existing file"):
        RunFolder("exp", {}, out=tmp_path / "f")
    with pytest.raises(RunFolderError, match=r"^--out .* cannot be created: .*f is not a folder"):
        RunFolder("exp", {}, out=tmp_path / "f" / "sub" / "r")
    assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_text() == "x"


def test_unwritable_out_is_refused_before_writing(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == str(parent) else real_access(p, mode)
    )
    with pytest.raises(RunFolderError, match=r"^--out .* cannot be created: .*ro is not writable"):
        RunFolder("exp", {}, out=parent / "a" / "r")
    with pytest.raises(RunFolderError, match=r"^--out .*ro is not writable"):
        RunFolder("exp", {}, out=parent)
    assert os.listdir(parent) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_out_really_unwritable(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o500)
    try:
        with pytest.raises(RunFolderError, match="not writable"):
            RunFolder("exp", {}, out=parent / "r")
    finally:
        parent.chmod(0o700)


def test_non_empty_folder_without_a_run_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="holds no run"):
        RunFolder("exp", {}, out=tmp_path)
    assert os.listdir(tmp_path) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    RunFolder("exp", {}, out=empty).run(_keys(1), _cell)  # an empty folder is fine


def test_bad_config_and_failing_first_cell_leave_nothing(tmp_path):
    with pytest.raises(TypeError, match="cannot write"):
        RunFolder("exp", {"f": object()}, out=tmp_path / "r")

    def boom(key):
        raise ValueError("unknown method 'foo'")

    with pytest.raises(ValueError, match="unknown method"):
        RunFolder("exp", {}, out=tmp_path / "r").run(_keys(), boom)
    assert os.listdir(tmp_path) == []


def test_run_grouped_with_nothing_to_do_still_creates_the_folder(tmp_path):
    run = RunFolder("exp", {}, out=tmp_path / "r")
    assert run.run([], _cell) == [] and (run.path / "config.json").is_file()
