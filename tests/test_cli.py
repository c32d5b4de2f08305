"""The ``jaxstale`` command (``jaxstale/cli.py``): list, help, errors, running an experiment.

The command line is run as a subprocess (``python -m jaxstale``) where its exit status and
streams matter; the installed console script is checked by ``tests/test_wheel.py`` (slow).
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxstale import cli

ROOT = Path(__file__).resolve().parents[1]
# The experiments as the folder holds them: public modules except the shared helpers.
EXPERIMENTS = sorted(
    [p.stem for p in (ROOT / "experiments").glob("*.py") if not p.stem.startswith("_")]
    + [p.parent.name for p in (ROOT / "experiments").glob("*/__init__.py")]  # packages
)
HELPERS = (
    "async_tables",
    "cliff_tables",
    "common",
    "config",
    "grids",
    "memory",
    "pipeline_tables",
    "precision",
    "presets",
    "reports",
    "runs",
    "starts",
    "throughput",
)
for helper in HELPERS:  # tables, figures and shared code, not experiments
    EXPERIMENTS.remove(helper)


def _summary(name):
    path = ROOT / "experiments" / f"{name}.py"
    if not path.exists():  # a package
        path = ROOT / "experiments" / name / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return doc.splitlines()[0]


def _jaxstale(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's jaxstale, whatever the venv has installed
    return subprocess.run(
        [sys.executable, "-m", "jaxstale", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_list_prints_every_experiment_with_its_description():
    res = _jaxstale("list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == EXPERIMENTS
    for name, line in zip(EXPERIMENTS, lines, strict=True):
        assert line.split(None, 1)[1] == _summary(name)


def test_list_reads_the_docstrings_without_importing_the_experiments():
    code = (
        "import sys; from jaxstale import cli; cli.main(['list']); "
        "print(sorted(m for m in sys.modules "
        "if m.startswith(('experiments.', 'jaxstale.experiments.')) and '.runs' not in m))"
    )  # the package's __init__ reads XLA_FLAGS through the run folders' fingerprint helper
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "[]"


def test_unknown_experiment_is_one_line_and_exit_status_2():
    res = _jaxstale("no_such_experiment", "--quick")
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == (
        "jaxstale: error: unknown experiment 'no_such_experiment'; choose one of: "
        + ", ".join(EXPERIMENTS)
        + "\n"
    )


def test_help_prints_usage_and_the_experiments():
    for flag in ("--help", "-h"):
        res = _jaxstale(flag)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("usage: jaxstale <experiment> [flags]")
        for name in EXPERIMENTS:
            assert f"  {name} " in res.stdout


def test_experiment_help_names_the_command():
    res = _jaxstale("async_workers", "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: jaxstale async_workers [-h] [--quick]")
    assert "--methods" in res.stdout  # the experiment's own flags


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "jaxstale: error: name an experiment, or `list`"),
        (["--quick"], "jaxstale: error: unknown option '--quick'"),
        (["list", "extra"], "jaxstale: error: `list` takes no arguments, got extra"),
    ],
)
def test_usage_errors_exit_2_with_one_error_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("jaxstale: error")]
    assert errors == [err.splitlines()[-1]]
    assert err.splitlines()[-1].startswith(message)


def test_main_runs_the_experiment_main_with_the_remaining_arguments(capsys):
    argv0 = sys.argv[0]
    with pytest.raises(SystemExit) as exit_:  # argparse's --help exits 0
        cli.main(["sync_baseline", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: jaxstale sync_baseline [-h] [--quick]")
    assert sys.argv[0] == argv0  # restored


def test_version(capsys):
    import jaxstale

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"jaxstale {jaxstale.__version__}\n"


def test_experiments_come_from_jaxstale_experiments_or_the_checkout(monkeypatch):
    # Under pytest jaxstale.experiments is this checkout's folder (conftest.py), as installed.
    assert cli.experiments_package() == "jaxstale.experiments"
    assert list(cli.experiments()) == EXPERIMENTS
    # Not installed: the checkout's top-level experiments package.
    monkeypatch.setitem(sys.modules, "jaxstale.experiments", None)
    assert cli.experiments_package() == "experiments"
    assert cli.experiments() == {name: _summary(name) for name in EXPERIMENTS}


def test_list_into_a_closed_pipe_is_not_an_error():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxstale", "list"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before anything is written (`jaxstale list | true`)
    assert proc.wait(timeout=300) == 0
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_a_helper_module_is_not_an_experiment():
    """``memory`` (the pipeline sweeps' memory pre-check) has no ``main``: it was listed, and
    ``jaxstale memory --help`` was an AttributeError traceback (issue 51)."""
    assert "memory" not in cli.experiments()
    res = _jaxstale("memory", "--help")
    assert res.returncode == 2 and "unknown experiment 'memory'" in res.stderr
    assert "Traceback" not in res.stderr


def test_every_listed_experiment_has_a_main():
    """A shared module added to experiments/ is listed as an experiment unless named in the
    helpers (experiments.precision once was): every listed name must be runnable."""
    import importlib

    for name in cli.experiments():
        module = importlib.import_module(f"{cli.experiments_package()}.{name}")
        assert callable(getattr(module, "main", None)), name
