"""Run folders: files get the ordinary modes."""

import os
import stat

import pytest

from jaxstale import runs
from jaxstale.runs import RunFolder


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
