"""Sphinx configuration for the jaxstale API reference.

Build with ``make docs`` (warnings are errors; no network needed: MathJax is loaded by the
reader's browser, nothing is fetched at build time).

Every area page (``api/*.rst``) has a hand-written introduction followed by
``.. include:: _generated/<area>.rst``; this file writes those includes on each build, one
``automodule`` per module found on disk, so a new module is documented without editing a page.
A module that belongs to no area is an error (add its prefix to ``AREAS`` below).
"""

from __future__ import annotations

import os
import pkgutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

# Same world as the tests: CPU, 8 emulated devices (some modules build meshes in examples).
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jaxstale  # noqa: E402

project = "jaxstale"
author = "jaxstale contributors"
copyright = "2026, jaxstale contributors"
release = jaxstale.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",  # the Markdown pages (design.md)
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# _generated/ files are included, not pages
exclude_patterns = ["_build", "api/_generated"]
# The guides link repository files outside docs/ (the claims report in study/, the benchmarks'
# result tables), which read on the repository's web page but are no pages of this site: myst
# leaves them as text. tests/test_docs.py checks that every relative link of a page points to a
# file that exists, which is what this warning would have caught.
suppress_warnings = ["myst.xref_missing"]
templates_path: list[str] = []
html_theme = "alabaster"
html_static_path: list[str] = []
html_theme_options = {
    "description": "Staleness in distributed training, in JAX",
    "fixed_sidebar": True,
}

# autodoc / napoleon (Google-style docstrings: Args:, Returns:, Example:, References:)
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" sections don't duplicate autodoc's attribute entries
napoleon_use_rtype = False
napoleon_custom_sections = [("References", "notes_style")]
# No intersphinx: the build must work offline. Unresolved cross-references are not warnings
# (nitpicky stays off), so types from jax/optax/flax render as plain names.

# --- the areas, one page each (docs/api/<page>.rst): (page, module prefixes) ---
AREAS: list[tuple[str, list[str]]] = [
    ("transforms", ["jaxstale.transforms", "jaxstale.lc_asgd"]),
    ("versions", ["jaxstale.versions", "jaxstale.delays", "jaxstale.delayed"]),
    ("pipeline", ["jaxstale.schedules", "jaxstale.pipeline"]),
    ("asyncdp", ["jaxstale.asyncdp", "jaxstale.localsgd"]),
    ("rl", ["jaxstale.rl"]),
    (
        "execution",
        [
            "jaxstale.loop",
            "jaxstale.evaluation",
            "jaxstale.checkpoint",
            "jaxstale.flops",
            "jaxstale.mesh",
            "jaxstale.launch",
            "jaxstale.distributed",
            "jaxstale.sizes",
        ],
    ),
    (
        "training",
        [
            "jaxstale.data",
            "jaxstale.text",
            "jaxstale.tokens",
            "jaxstale.ngram",
            "jaxstale.tasks",
            "jaxstale.models",
            "jaxstale.losses",
            "jaxstale.optimizers",
            "jaxstale.train",
            "experiments.runs",
        ],
    ),
    # The command and the scripts it runs. The scripts are documented once, as experiments.*
    # (the folder on disk); the wheel ships the same files as jaxstale.experiments.*.
    ("experiments", ["jaxstale.cli", "experiments", "jaxstale.experiments"]),
]


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _modules() -> list[str]:
    """All public modules of jaxstale and the experiment scripts, found on disk."""
    names = [
        m.name
        for m in pkgutil.walk_packages(jaxstale.__path__, prefix="jaxstale.")
        if _public(m.name) and not m.name.startswith("jaxstale.experiments")  # as experiments.*
    ]
    names += [
        f"experiments.{m.name}"
        for m in pkgutil.iter_modules([str(ROOT / "experiments")])
        if _public(m.name)
    ]
    names += [  # the lab's run folders, fingerprints, statistics, tables and plots
        f"experiments.runs.{m.name}"
        for m in pkgutil.iter_modules([str(ROOT / "experiments" / "runs")])
        if _public(m.name)
    ]
    return sorted(names)


def _area_of(module: str) -> str:
    for page, prefixes in AREAS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return page
    raise RuntimeError(
        f"docs/conf.py: module {module!r} belongs to no API page; add its prefix to AREAS"
    )


def _write_generated() -> None:
    by_area: dict[str, list[str]] = {page: [] for page, _ in AREAS}
    for module in _modules():
        by_area[_area_of(module)].append(module)
    out = DOCS / "api" / "_generated"
    out.mkdir(parents=True, exist_ok=True)
    for page, modules in by_area.items():
        lines = []
        for module in modules:
            title = f"``{module}``"
            lines += [title, "-" * len(title), "", f".. automodule:: {module}", ""]
        if not modules:
            lines = ["(No modules in this area yet.)", ""]
        text = "\n".join(lines)
        path = out / f"{page}.rst"
        if not path.exists() or path.read_text() != text:  # keep mtimes: incremental builds
            path.write_text(text)


if "tags" in globals():  # executed by Sphinx (not imported by tests/test_docs.py)
    _write_generated()
