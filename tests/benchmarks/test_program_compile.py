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
