"""The program-compile benchmark on its quick setting: the two replays agree (asserted inside
the benchmark) and every time is measured; nothing is written."""

import pytest

from benchmarks import program_compile


def test_quick_rows_agree_and_write_nothing(tmp_path):
    out = program_compile.main(["--quick", "--stages", "4", "--out", str(tmp_path)])
    assert [r["schedule"] for r in out["rows"]] == ["1f1b", "2bw", "gpipe"]
    assert all(r["replay_new_s"] > 0 and r["events"] > 0 for r in out["rows"])
    assert "N = 4, 200 mini-batches" in out["text"]
    assert not (tmp_path / "program_compile.md").exists()


def test_a_bad_size_is_one_line(capsys):
    with pytest.raises(SystemExit):
        program_compile.main(["--stages", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "argument --stages: expected an int in [1, inf), got 0" in err[-1]


@pytest.mark.slow  # 8 s: two rounds of gpt-tiny compiled
def test_quick_xla_rounds_are_compiled_and_tabled(tmp_path):
    out = program_compile.main(["--quick", "--xla", "--stages", "2", "--out", str(tmp_path)])
    assert [r["stages"] for r in out["xla"]] == [1, 2]
    assert all(r["compile_s"] > 0 and r["instructions"] > 1000 for r in out["xla"])
    assert "XLA's compile of the emulator's round (gpt-tiny, 2 blocks" in out["text"]
    assert "| 1 | " in out["text"] and "1.00x" in out["text"]


@pytest.mark.slow  # 16 s: four rounds of gpt-tiny compiled
def test_the_equal_slot_probe_is_tabled_beside_each_depth(tmp_path):
    out = program_compile.main(["--quick", "--xla", "--equal-slots", "--out", str(tmp_path)])
    assert [(r["stages"], r["equal_slots"]) for r in out["xla"]] == [
        (1, False), (1, True), (2, False), (2, True)
    ]  # fmt: skip
    assert "| compile, one slot shape (s) | / N = 1 |" in out["text"]
    row = [x for x in out["text"].splitlines() if x.startswith("| 2 | ")][-1]
    assert row.count("x |") == 2  # both ratios, the floor layout's and the probe's
