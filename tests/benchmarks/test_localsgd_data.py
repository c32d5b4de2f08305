"""benchmarks/localsgd_data.py: both data forms give the same run; the table is written."""

import pytest

from benchmarks import localsgd_data
from jaxstale import data


@pytest.mark.slow  # 10 s; tests/localsgd/test_emulator.py's indexed-streams test stays in make test
def test_both_forms_give_the_same_losses_and_indexed_holds_less():
    copy = localsgd_data.peak("copy", 30, 2, 2)
    indexed = localsgd_data.peak("indexed", 30, 2, 2)
    assert copy["loss"] == indexed["loss"]
    # [L, M·steps, B, 40, 1] float32 inputs + int32 labels: 2 lanes, 2 workers, 30 steps
    assert copy["held"] == 2 * 2 * 30 * 32 * (40 * 4 + 4)
    ds = data.load("mnist1d")
    split = ds.x_train.nbytes + ds.y_train.nbytes
    assert indexed["held"] == split + 2 * 2 * 30 * 32 * 4  # one split, int32 indices per lane
    ms = localsgd_data.interleaved(30, 2, 2, reps=2, rounds=2)
    assert set(ms) == {"copy", "indexed"} and min(ms.values()) > 0


def test_bad_arguments():
    with pytest.raises(SystemExit):
        localsgd_data.main(["--steps", "30", "--reps", "2", "--rounds", "20", "--no-write"])
    with pytest.raises(SystemExit):
        localsgd_data.main(["--lanes", "0", "--no-write"])


@pytest.mark.slow  # two child processes
def test_main_writes_the_table(tmp_path):
    args = ["--steps", "200", "--lanes", "2", "--workers", "2", "--reps", "2", "--rounds", "5"]
    text = localsgd_data.main([*args, "--out", str(tmp_path)])
    assert "| indexed |" in text and (tmp_path / "localsgd_data.md").read_text() == text + "\n"
