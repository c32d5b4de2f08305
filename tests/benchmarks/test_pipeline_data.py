"""benchmarks/pipeline_data.py: both data forms give the same run; the table is written."""

import pytest

from benchmarks import pipeline_data


def test_both_forms_give_the_same_losses_and_indexed_holds_less():
    copy = pipeline_data.peak("copy", 300, 2, 2)
    indexed = pipeline_data.peak("indexed", 300, 2, 2)
    assert copy["loss"] == indexed["loss"]
    assert copy["held"] == 2 * 300 * 32 * (40 * 4 + 4)  # [L, steps, B, 40] float32 + int32 labels
    assert indexed["held"] < copy["held"]
    ms = pipeline_data.interleaved(300, 2, 2, reps=2, rounds=5)
    assert set(ms) == {"copy", "indexed"} and min(ms.values()) > 0


def test_bad_arguments():
    with pytest.raises(SystemExit):
        pipeline_data.main(["--steps", "50", "--reps", "2", "--rounds", "20", "--no-write"])
    with pytest.raises(SystemExit):
        pipeline_data.main(["--lanes", "0", "--no-write"])


@pytest.mark.slow  # two child processes
def test_main_writes_the_table(tmp_path):
    args = ["--steps", "200", "--lanes", "2", "--stages", "2", "--reps", "2", "--rounds", "10"]
    text = pipeline_data.main([*args, "--out", str(tmp_path)])
    assert "| indexed |" in text and (tmp_path / "pipeline_data.md").read_text() == text + "\n"
