"""The wheel ships the experiments as ``jaxstale.experiments``: pyproject lists every package."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packages_on_disk():
    found = set()
    for top, name in (("jaxstale", "jaxstale"), ("experiments", "jaxstale.experiments")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join([name, *parts]))
    return found


def test_pyproject_lists_every_package():
    setuptools = PYPROJECT["tool"]["setuptools"]
    listed, on_disk = set(setuptools["packages"]), _packages_on_disk()
    assert listed == on_disk, (
        f"[tool.setuptools] packages in pyproject.toml: add {sorted(on_disk - listed)}, "
        f"remove {sorted(listed - on_disk)}"
    )
    assert setuptools["package-dir"] == {"jaxstale.experiments": "experiments"}
