"""``python -m study``: a bad flag is one line on stderr, exit status 2, nothing written."""

import pytest

import study


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--only", "nope"], "unknown configuration 'nope'"),
        (["--only", "async-fixed-lr,async-fixed-lr"], "given twice"),
    ],
)
def test_bad_only_is_one_line_exit_2_and_nothing_written(argv, words, tmp_path, capsys):
    out, report = tmp_path / "run", tmp_path / "claims.md"
    with pytest.raises(SystemExit) as e:
        study.main([*argv, "--run", "--results", str(out), "--out", str(report)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert ": error: argument --only" in err[-1] and words in err[-1], err[-1]
    assert not out.exists() and not report.exists()


def test_restore_from_a_folder_that_does_not_exist_is_one_line(tmp_path, capsys):
    """``--restore --cells <typo>`` restored nothing and exited 0 (issue 51)."""
    missing, out = tmp_path / "no-such-cells", tmp_path / "results"
    with pytest.raises(SystemExit) as e:
        study.main(["--restore", "--cells", str(missing), "--results", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert "argument --cells" in err[0] and "no-such-cells" in err[0]
    assert not out.exists()
