"""The ``jaxstale`` command: run an experiment by name, or list them.

Command line (``python -m jaxstale ...`` is the same)::

    jaxstale list                          the experiments, with their one-line descriptions
    jaxstale <experiment> [flags]          run it, e.g. jaxstale async_workers --quick --out DIR
    jaxstale <experiment> --help           its flags
    jaxstale --help | --version

An experiment is a public module or package (``async_bn``) of :mod:`jaxstale.experiments` other
than its shared helpers (``common``, ``config``, ``presets``), and
``jaxstale <experiment> ARGS`` calls that module's ``main(ARGS)``. ``jaxstale.experiments`` is
the repository's ``experiments/`` folder, shipped in the wheel (and mapped by an editable
install) under that name; in a checkout that is not installed, the folder is the top-level
package ``experiments`` and is used as such (``python -m experiments.<name>`` runs the same
code). Listing reads the modules' docstrings from their source without importing them, and
this module imports no jax itself; the ``jaxstale`` package it belongs to does, which is most
of the 1.5-2.5 s that ``jaxstale list`` takes on a 2-core CPU.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from jaxstale._program import run_as_program

PROG = "jaxstale"
# shared helpers, not commands
_NOT_EXPERIMENTS = frozenset(
    {
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
    }
)


def _folders(name: str) -> list[Path]:
    """The folders of the importable package ``name`` (none if it is not importable)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    locations = spec.submodule_search_locations if spec is not None else None
    return [Path(p).resolve() for p in locations or []]


def experiments_package() -> str:
    """The name of the package the experiments are imported from.

    ``"jaxstale.experiments"`` (an installed wheel, an editable install), or ``"experiments"``,
    the ``experiments/`` folder beside this ``jaxstale/`` in a checkout that is on ``sys.path``
    but not installed. Whichever is *this* jaxstale's is preferred: a virtualenv with an
    editable install of another checkout maps ``jaxstale.experiments`` to that checkout's
    folder, and is only used when this one has none.

    Returns:
      The package name.

    Raises:
      ModuleNotFoundError: neither is importable.

    Example:
      >>> experiments_package() in ("jaxstale.experiments", "experiments")
      True
    """
    here = Path(__file__).resolve().parent
    installed = _folders("jaxstale.experiments")
    if here / "experiments" in installed or here.parent / "experiments" in installed:
        return "jaxstale.experiments"
    if here.parent / "experiments" in _folders("experiments"):
        return "experiments"
    if installed:
        return "jaxstale.experiments"
    raise ModuleNotFoundError(
        "jaxstale: no experiments found: neither jaxstale.experiments (an installed jaxstale) "
        f"nor the checkout's experiments/ folder ({here.parent / 'experiments'}) is importable"
    )


def _summary(path: str | None) -> str:
    """The first line of the docstring of the module at ``path``, read from its source."""
    if path is None or not path.endswith(".py"):
        return ""
    doc = ast.get_docstring(ast.parse(Path(path).read_text(encoding="utf-8")))
    return doc.strip().splitlines()[0] if doc and doc.strip() else ""


def experiments() -> dict[str, str]:
    """The experiments, by name, with their one-line descriptions (nothing is imported).

    Returns:
      ``{name: first line of the module docstring}``, sorted by name.

    Example:
      >>> "async_workers" in experiments() and "common" not in experiments()
      True
    """
    package = experiments_package()
    pkg = importlib.import_module(package)  # its __init__ is docs only: cheap
    found: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_EXPERIMENTS:
            continue
        spec = importlib.util.find_spec(f"{package}.{info.name}")
        found[info.name] = _summary(spec.origin if spec is not None else None)
    return found


def usage(names: dict[str, str] | None = None) -> str:
    """The ``--help`` text: how to call the command, then the experiments.

    Args:
      names: the experiments and their descriptions (default: :func:`experiments`).

    Returns:
      The text, ending with a newline.

    Example:
      >>> print(usage({"demo": "A demo."}))
      usage: jaxstale <experiment> [flags]   run an experiment (flags: jaxstale <experiment> -h)
             jaxstale list                   list the experiments
             jaxstale --help | --version
      ...
      experiments:
        demo  A demo.
    """
    names = experiments() if names is None else names
    lines = [
        f"usage: {PROG} <experiment> [flags]   run an experiment (flags: {PROG} <experiment> -h)",
        f"       {PROG} list                   list the experiments",
        f"       {PROG} --help | --version",
        "",
        f"Runs the experiment's main(flags); `python -m {PROG}` is the same command.",
        "",
        "experiments:",
        _table(names, indent="  "),
    ]
    return "\n".join(lines) + "\n"


def _table(names: dict[str, str], indent: str = "") -> str:
    width = max((len(n) for n in names), default=0)
    return "\n".join(f"{indent}{n.ljust(width)}  {d}".rstrip() for n, d in names.items())


def _out(text: str) -> int:
    """Print ``text`` on stdout; a reader that closed early (``jaxstale list | head``) is fine."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point it elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def console() -> NoReturn:
    """The ``jaxstale`` console script and ``python -m jaxstale``: :func:`main` as the whole
    program, Ctrl-C ending it with status 130 at once (:func:`jaxstale._program.run_as_program`)."""
    run_as_program(main)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jaxstale`` command line (the console script and ``python -m jaxstale``).

    Args:
      argv: the arguments after the command name (default ``sys.argv[1:]``).

    Returns:
      The exit status: 0, or 2 for a usage error (one line on stderr). An experiment's own
      ``--help`` or a bad flag of it exits through ``SystemExit``, as ``argparse`` does.

    Example:
      >>> main(["list"])  # doctest: +ELLIPSIS
      async_bn ...
      0
      >>> main(["no_such_experiment"])
      2
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(usage())
        return _error("name an experiment, or `list`")
    head, rest = args[0], args[1:]
    if head in ("-h", "--help"):
        return _out(usage())
    if head == "--version":
        import jaxstale

        return _out(f"{PROG} {jaxstale.__version__}\n")
    if head == "list":
        if rest:
            return _error(f"`list` takes no arguments, got {' '.join(rest)}")
        return _out(_table(experiments()) + "\n")
    if head.startswith("-"):
        return _error(
            f"unknown option {head!r}; give an experiment first, then its flags "
            f"({PROG} <experiment> --help), or see {PROG} --help"
        )
    names = experiments()
    if head not in names:
        return _error(f"unknown experiment {head!r}; choose one of: {', '.join(names)}")
    module = importlib.import_module(f"{experiments_package()}.{head}")  # imports jax
    # The experiment's argparse names itself after sys.argv[0]: "usage: jaxstale NAME ...".
    saved = sys.argv[0] if sys.argv else None
    if sys.argv:
        sys.argv[0] = f"{PROG} {head}"
    try:
        module.main(rest)
    finally:
        if saved is not None:
            sys.argv[0] = saved
    return 0
