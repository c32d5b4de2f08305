"""Code fingerprints: which code and library versions computed a run's results.

A run folder's id hashes its config only, so the same command maps to the same folder. That
is what makes resume work, but it also means that after an edit to a method's code a re-run
would find the old cells and report the old numbers. :func:`code_fingerprint` describes the code
(hashes of the jaxstale sources, of the experiment's modules and of user-registered functions,
the library versions and the git commit); :class:`~jaxstale.runs.RunFolder` records it and
refuses to mix cells computed under different code (:class:`~jaxstale.runs.StaleResultsError`).

The parts that decide whether two fingerprints compute the same results are
:data:`RESULT_PARTS`: the three source hashes and the versions of jax, jaxlib, optax and flax.
The git commit and the numpy/Python versions are recorded for the reader but do not decide (a
commit that only edits the README changes no result; a changed source file shows up in the
source hashes, committed or not).

Hashing is cheap: every file is read and hashed once per process (the digest is cached under
its path, size and modification time, so an edited file is hashed again).

Example:
    >>> from jaxstale.runs import code_fingerprint, code_hash
    >>> fp = code_fingerprint(sources=["def build(hp): return hp"])
    >>> sorted(fp)
    ['experiment_sha', 'git_commit', 'jaxstale', 'source_sha', 'user_sha', 'versions']
    >>> sorted(fp["versions"])
    ['flax', 'jax', 'jaxlib', 'numpy', 'optax', 'python']
    >>> fp["experiment_sha"] is None  # no experiment modules given
    True
    >>> code_hash(fp) == code_hash(code_fingerprint(sources=["def build(hp): return hp"]))
    True
    >>> code_hash(fp) == code_hash(code_fingerprint(sources=["def build(hp): return 2 * hp"]))
    False
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import marshal
import os
import platform
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["RESULT_PARTS", "code_changes", "code_fingerprint", "code_hash"]

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the jaxstale package folder

#: The fingerprint entries that decide whether cached results are still valid: a dotted path
#: into the fingerprint dict -> the name used in messages.
RESULT_PARTS: dict[str, str] = {
    "source_sha": "jaxstale source",
    "experiment_sha": "experiment source",
    "user_sha": "user sources",
    "versions.jax": "jax",
    "versions.jaxlib": "jaxlib",
    "versions.optax": "optax",
    "versions.flax": "flax",
}

_VERSIONED = ("jax", "jaxlib", "optax", "flax", "numpy")

# (resolved path, size, mtime_ns) -> sha256 digest of the file's bytes
_FILE_DIGESTS: dict[tuple[str, int, int], bytes] = {}


def _file_digest(path: Path) -> bytes:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    digest = _FILE_DIGESTS.get(key)
    if digest is None:
        digest = hashlib.sha256(path.read_bytes()).digest()
        _FILE_DIGESTS[key] = digest
    return digest


def _py_files(folder: Path) -> list[tuple[str, Path]]:
    """Every ``.py`` file under ``folder`` (no caches, no hidden folders), by relative path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((path.relative_to(folder).as_posix(), path))
    return sorted(found)


def _hash_files(files: Iterable[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for rel, path in files:
        h.update(rel.encode() + b"\0" + _file_digest(path))
    return h.hexdigest()


def _module_files(module: ModuleType | str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """The source files of a module (a package: all its ``.py`` files) or of a path."""
    if isinstance(module, ModuleType):
        file = getattr(module, "__file__", None)
        if file is None:
            raise ValueError(f"module {module.__name__!r} has no source file to fingerprint")
        path = Path(file).resolve()
        if path.name == "__init__.py":
            path = path.parent
    else:
        path = Path(module).resolve()
    if path.is_dir():
        return [(f"{path.name}/{rel}", p) for rel, p in _py_files(path)]
    if not path.is_file():
        raise ValueError(f"cannot fingerprint {module!r}: {path} is not a file or folder")
    return [(path.name, path)]


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _source_text(obj: Any) -> str:
    """The source text of a user object: a string as is, else its source, else a stable repr."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, functools.partial):
        return "partial(" + "|".join(
            [_source_text(obj.func), repr(obj.args), repr(sorted(obj.keywords.items()))]
        )
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        pass
    code = getattr(obj, "__code__", None)
    if code is not None:  # e.g. defined at an interactive prompt: its compiled code
        name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        return name + ":" + marshal.dumps(code).hex()
    return _ADDRESS.sub("", repr(obj))  # addresses change from one process to the next


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit(folder: Path) -> str | None:
    """HEAD of the git repository holding ``folder``; None when there is none (never raises)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def code_fingerprint(
    *,
    modules: Iterable[ModuleType | str | os.PathLike[str]] = (),
    sources: Iterable[Any] = (),
) -> dict[str, Any]:
    """Describes the code that computes a run: source hashes, library versions, git commit.

    Args:
      modules: the experiment's own source: module objects (a package counts with all its
        ``.py`` files), or paths of files or folders. Pass the experiment module and the helper
        modules it uses, e.g. ``modules=(sys.modules[__name__], common)``. The first one also
        locates the git repository. Files are named by their base name (folders by their
        relative paths), so the same code checked out elsewhere gives the same hash.
      sources: user code the results depend on that lives outside jaxstale and the experiment,
        e.g. the builders of user-registered methods. Each item is a string (taken as source
        text) or any object: its source text by :func:`inspect.getsource`; without one (defined
        at a prompt) its compiled code; else its ``repr`` without memory addresses.
        The order of the items does not matter.

    Returns:
      ``{"jaxstale": version, "source_sha": sha256 of every .py file of the jaxstale package
      (sorted by relative path), "experiment_sha": sha256 of ``modules``' files (None if none
      given), "user_sha": sha256 of ``sources`` (None if none given), "versions": {"jax",
      "jaxlib", "optax", "flax", "numpy", "python"}, "git_commit": HEAD of the repository of the
      first module (else of the jaxstale package), or None when not in a git checkout or git is
      missing}``. Plain JSON; :func:`code_hash` condenses the parts that decide results.

    Raises:
      ValueError: a module has no source file, or a path does not exist.

    Example:
      >>> fp = code_fingerprint()
      >>> len(fp["source_sha"]), fp["user_sha"], fp["versions"]["python"].count(".")
      (64, None, 2)
    """
    files = [f for m in modules for f in _module_files(m)]
    user = sorted(hashlib.sha256(_source_text(s).encode()).hexdigest() for s in sources)
    where = files[0][1].parent if files else PACKAGE_DIR
    return {
        "jaxstale": _version("jaxstale"),
        "source_sha": _hash_files(_py_files(PACKAGE_DIR)),
        "experiment_sha": _hash_files(files) if files else None,
        "user_sha": hashlib.sha256("\n".join(user).encode()).hexdigest() if user else None,
        "versions": {
            **{name: _version(name) for name in _VERSIONED},
            "python": platform.python_version(),
        },
        "git_commit": _git_commit(where),
    }


def _part(code: Mapping[str, Any], dotted: str) -> Any:
    value: Any = code
    for name in dotted.split("."):
        value = value.get(name) if isinstance(value, Mapping) else None
    return value


def code_hash(code: Mapping[str, Any]) -> str:
    """Short hash (16 hex characters) of the parts of a fingerprint that decide results.

    Those are :data:`RESULT_PARTS`; the git commit and the numpy/Python versions are left out,
    so a commit that changes no source, or a numpy patch release, keeps cached results valid.

    Args:
      code: a fingerprint from :func:`code_fingerprint` (missing entries count as None).

    Returns:
      The hex hash.

    Example:
      >>> fp = code_fingerprint()
      >>> code_hash(fp) == code_hash({**fp, "git_commit": "0" * 40})
      True
    """
    parts = {name: _part(code, name) for name in RESULT_PARTS}
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def code_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """The result-deciding parts that differ between two fingerprints, in words.

    Args:
      old: the earlier fingerprint, or None when none was recorded.
      new: the current fingerprint.

    Returns:
      e.g. ``["user sources", "jax 0.4.30 -> 0.5.0"]``; ``["no code fingerprint recorded"]``
      when ``old`` is None.

    Example:
      >>> old = {"source_sha": "a", "versions": {"jax": "0.4.30"}}
      >>> code_changes(old, {"source_sha": "b", "versions": {"jax": "0.5.0"}})
      ['jaxstale source', 'jax 0.4.30 -> 0.5.0']
    """
    if old is None:
        return ["no code fingerprint recorded (written by an older jaxstale)"]
    changed = []
    for dotted, label in RESULT_PARTS.items():
        a, b = _part(old, dotted), _part(new, dotted)
        if a != b:
            changed.append(f"{label} {a} -> {b}" if dotted.startswith("versions.") else label)
    return changed
