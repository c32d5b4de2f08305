"""A start the cells of a run folder share: read back, not retrained; a file that does not match
its digest and a start that is not the one the folder's rows record are refused."""

import numpy as np
import pytest

from experiments import runs, starts


def _folder(tmp_path):
    return runs.RunFolder("demo", {"x": 1}, tmp_path / "run")


def test_a_start_is_trained_once_and_read_back(tmp_path):
    folder, calls = _folder(tmp_path), []
    like = {"b": np.zeros(2), "w": np.zeros((2, 3))}
    train = lambda: calls.append(1) or {"b": np.ones(2), "w": np.arange(6.0).reshape(2, 3)}
    a, d = starts.cached(folder, "s", train, like=like)
    b, e = starts.cached(folder, "s", train, like=like)
    assert calls == [1] and d == e == starts.digest(a)
    np.testing.assert_array_equal(b["w"], a["w"])
    assert starts.digest({"w": np.zeros(2)}) != starts.digest({"w": np.zeros(2, np.float32)})


def test_a_corrupt_file_and_a_foreign_start_are_refused(tmp_path):
    folder = _folder(tmp_path)
    like = {"w": np.zeros(3)}
    starts.cached(folder, "s", lambda: {"w": np.ones(3)}, like=like)
    path = folder.path / "inputs" / "s.npz"
    with np.load(path) as z:
        np.savez(path, digest=z["digest"], a0=np.full(3, 2.0))
    with pytest.raises(runs.RunFolderError, match="does not match its digest"):
        starts.cached(folder, "s", lambda: {"w": np.ones(3)}, like=like)
    folder.record({"seed": 0}, {"start_digest": "0123456789abcdef"}, [])
    with pytest.raises(runs.RunFolderError, match=r"started from 0123456789abcdef.*--restore"):
        starts.cached(folder, "t", lambda: {"w": np.ones(3)}, like=like)
    # rows the start is not for do not count
    starts.cached(folder, "u", lambda: {"w": np.ones(3)}, like=like, cells=lambda r: False)
