"""jaxstale._program: Ctrl-C ends a program with status 130 at once, without the interpreter's
teardown (where a compile still running on XLA's thread pool segfaulted: issue 51)."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import atexit, sys
from jaxstale._program import run_as_program
atexit.register(lambda: print("teardown ran", flush=True))

def main():
    print("working", flush=True)
    {body}

run_as_program(main)
"""


def _run(body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(SCRIPT).format(body=body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("body", "err"),
    [
        ("raise SystemExit(130)", ""),  # a sweep's handler has already said what it saved
        ("raise KeyboardInterrupt", "interrupted\n"),  # Ctrl-C outside a sweep
    ],
)
def test_an_interrupt_exits_130_without_the_teardown(body, err):
    got = _run(body)
    assert got.returncode == 130 and got.stdout == "working\n" and got.stderr == err


@pytest.mark.parametrize(
    ("body", "code"),
    [("return 0", 0), ("return 3", 3), ("sys.exit(2)", 2), ("return {'table': 1}", 0)],
)
def test_other_endings_leave_as_usual(body, code):
    got = _run(body)
    assert got.returncode == code and got.stdout == "working\nteardown ran\n"


def test_the_console_script_and_python_m_run_as_programs():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["jaxstale"] == "jaxstale.cli:console"
    mains = [root / "jaxstale" / "__main__.py", root / "study" / "__main__.py"]
    mains += sorted((root / "experiments").glob("*/__main__.py"))
    for path in mains:
        text = path.read_text()
        assert "run_as_program(main)" in text or "console()" in text, path
    for path in sorted((root / "experiments").glob("*.py")):
        text = path.read_text()
        if 'if __name__ == "__main__":' in text:
            assert "run_as_program(main)" in text, path
