"""The GPU check's comparison of run folders: matched cells, bit-identity, largest differences."""

import json

from benchmarks import _gpu_compare as gpu_compare


def _folder(path, losses, curve=0.5):
    path.mkdir()
    rows = [
        {
            "method": m,
            "seed": s,
            "final_test_loss": v,
            "diverged": False,
            "wall_s": 1.0 + v,
            "cpu_s": 2.0 + v + len(path.name),
        }  # timings: differ by folder
        for (m, s), v in losses.items()
    ]
    (path / "summary.json").write_text(json.dumps({"rows": rows}))
    (path / "metrics.jsonl").write_text(json.dumps({"step": 20, "val": curve, "wall_s": 3}) + "\n")
    return path


def test_identical_close_and_missing_runs(tmp_path):
    cells = {("sync", 0): 3.1, ("vanilla", 0): 3.2}
    ref = _folder(tmp_path / "ref", cells)
    same = _folder(tmp_path / "same", cells)  # wall and CPU times differ, nothing else
    (same / "metrics.jsonl").write_text(json.dumps({"step": 20, "val": 0.5, "wall_s": 9}) + "\n")
    close = _folder(tmp_path / "close", {("sync", 0): 3.1, ("vanilla", 0): 3.2 + 2**-20})
    other_curve = _folder(tmp_path / "curve", cells, curve=0.25)
    fewer = _folder(tmp_path / "fewer", {("sync", 0): 3.1})

    assert gpu_compare.compare(ref, same) == {
        "rows": "2 of 2", "bit_identical": True, "rows_identical": True,
        "max_abs": {"final_test_loss": 0.0},
    }  # fmt: skip
    c = gpu_compare.compare(ref, close)
    assert not c["bit_identical"] and not c["rows_identical"]
    assert abs(c["max_abs"]["final_test_loss"] - 2**-20) < 1e-12
    c = gpu_compare.compare(ref, other_curve)
    assert c["rows_identical"] and not c["bit_identical"]
    c = gpu_compare.compare(ref, fewer)
    assert c["rows"] == "1 of 2" and not c["rows_identical"]

    text = gpu_compare.main([str(ref), str(same), str(close), str(tmp_path / "unfinished")])
    lines = text.splitlines()
    assert lines[4].startswith("| `same` | 2 of 2 | yes | yes | final_test_loss 0 |")
    assert lines[5].startswith("| `close` | 2 of 2 | no | no | final_test_loss 9.54e-07 |")
    assert lines[-1].endswith("unfinished")
