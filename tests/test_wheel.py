"""The wheel: it ships the experiments as ``jaxstale.experiments`` and the ``jaxstale`` command.

``test_pyproject_lists_every_package`` is fast. The slow test builds the wheel from a copy of
the sources, installs it into a fresh virtualenv and, from a directory outside the repository,
runs ``jaxstale list``, a small ``jaxstale async_workers`` and the tutorial's "Prototype your own
method" example. The virtualenv gets jaxstale only from the wheel; its dependencies (jax, flax,
...) are borrowed from the environment running the tests through a ``.pth`` line naming a
folder of links to that environment's site-packages *without* its jaxstale (an editable
install's finder, or a copy), so nothing is downloaded but the build backend, and nothing can
shadow the installed wheel.
"""

import ast
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_cli import HELPERS  # the shared helpers, not experiments

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# What the build reads: the metadata files and the two package folders.
# study/ and docs/ are copied too, so that the wheel is seen to leave them out
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "jaxstale", "experiments", "study", "docs"]
README_BLOCKS = re.findall(  # the tutorial's "Prototype your own method" example
    r"```python\n(.*?)```", (ROOT / "docs" / "tutorials" / "your-method.md").read_text(), flags=re.S
)


def _packages_on_disk():
    found = set()
    for top, name in (("jaxstale", "jaxstale"), ("experiments", "jaxstale.experiments")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join([name, *parts]))
    found.add("jaxstale.data_files")  # data only (the embedded corpus), no __init__.py
    return found


def test_pyproject_lists_every_package():
    setuptools = PYPROJECT["tool"]["setuptools"]
    listed, on_disk = set(setuptools["packages"]), _packages_on_disk()
    assert listed == on_disk, (
        f"[tool.setuptools] packages in pyproject.toml: add {sorted(on_disk - listed)}, "
        f"remove {sorted(listed - on_disk)}"
    )
    assert setuptools["package-dir"] == {"jaxstale.experiments": "experiments"}
    assert PYPROJECT["project"]["scripts"] == {"jaxstale": "jaxstale.cli:console"}


def _run(cmd, cwd, env, timeout=600):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _dependencies_without_jaxstale(dest: Path) -> Path:
    """A folder of links to this environment's site-packages, less jaxstale and .pth files."""
    dest.mkdir()
    for sp in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]):
        if not os.path.isdir(sp):
            continue
        for entry in sorted(os.listdir(sp)):
            if "jaxstale" in entry.lower() or entry.endswith(".pth") or (dest / entry).exists():
                continue
            (dest / entry).symlink_to(Path(sp) / entry)
    return dest


@pytest.mark.slow
def test_installed_wheel_runs_the_experiments_from_anywhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    src = tmp_path / "src"  # built from a copy: no build/ or egg-info in the checkout
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)], src, env)
    (wheel,) = (tmp_path / "dist").glob("jaxstale-*.whl")
    with zipfile.ZipFile(wheel) as z:  # no study code or data, no docs
        names = z.namelist()
    assert not [n for n in names if n.startswith(("study/", "docs/")) or "/claims" in n], names
    assert not [n for n in names if n.endswith((".png", ".jsonl.xz"))], names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python, command = venv / "bin" / "python", venv / "bin" / "jaxstale"
    _run([*pip, "--python", str(python), "install", "-q", "--no-deps", str(wheel)], tmp_path, env)
    deps = _dependencies_without_jaxstale(tmp_path / "deps")
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        tmp_path,
        env,
    ).strip()
    (Path(purelib) / "zz_test_dependencies.pth").write_text(f"{deps}\n")

    work = tmp_path / "elsewhere"  # outside the repository: only the wheel provides jaxstale
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)
    probe = (
        "import importlib.util, jaxstale, jaxstale.experiments.async_workers as m; "
        "print(jaxstale.__file__); print(m.__file__); "
        "print(importlib.util.find_spec('experiments'))"
    )
    jaxstale_file, module_file, top_level = _run([str(python), "-c", probe], work, env).split()
    assert Path(jaxstale_file).is_relative_to(purelib)
    assert Path(module_file) == Path(purelib) / "jaxstale" / "experiments" / "async_workers.py"
    assert top_level == "None"  # no top-level experiments package: only jaxstale.experiments

    listed = _run([str(command), "list"], work, env).splitlines()
    assert _run([str(python), "-m", "jaxstale", "list"], work, env).splitlines() == listed
    expected = sorted(
        [p.stem for p in (ROOT / "experiments").glob("[!_]*.py")]
        + [p.parent.name for p in (ROOT / "experiments").glob("*/__init__.py")]  # async_bn
    )
    for helper in HELPERS:  # tables, figures and shared code, not experiments
        expected.remove(helper)
    assert [line.split()[0] for line in listed] == expected
    doc = ast.get_docstring(ast.parse((ROOT / "experiments" / "async_workers.py").read_text()))
    assert listed[expected.index("async_workers")].split(None, 1)[1] == doc.splitlines()[0]

    tiny = ["--seeds", "1", "--workers", "1,4", "--methods", "sgd,asgd"]
    _run([str(command), "async_workers", "--quick", *tiny, "--out", str(work / "run")], work, env)
    assert (work / "run" / "summary.json").is_file()
    assert not (work / "results").exists()  # --out is where everything went

    # The tutorial's "Prototype your own method" example, as a user of the wheel runs it.
    (example,) = [
        b for b in README_BLOCKS if "jaxstale.experiments import" in b and "register_method" in b
    ]
    (work / "readme").mkdir()
    _run([str(python), "-c", example], work / "readme", env)
    assert (work / "readme" / "results" / "my_method" / "summary.json").is_file()
