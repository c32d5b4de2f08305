"""Code fingerprints: which code and library versions computed a run's results.

A run folder's id hashes its config only, so the same command maps to the same folder. That
is what makes resume work, but it also means that after an edit to a method's code a re-run
would find the old cells and report the old numbers. :func:`code_fingerprint` describes the code
(hashes of the jaxstale sources, of the experiment's modules and of user-registered functions,
the datasets' content digests, the library versions and the git commit);
:class:`~experiments.runs.RunFolder` records it and refuses to mix cells computed under different
code (:class:`~experiments.runs.StaleResultsError`).

The parts that decide whether two fingerprints compute the same results are
:data:`RESULT_PARTS`: the three source hashes, the data digest, the versions of jax, jaxlib,
optax and flax, and the backend that computes (:func:`backend_fingerprint`: platform, device
kind, matmul precision, GPU deterministic ops). The git commit and the numpy/Python versions
are recorded for the reader but do not decide (a commit that only edits the README changes no
result; a changed source file shows up in the source hashes, committed or not), and so is the
machine (:func:`~experiments.runs.hosts.host_fingerprint`: a sweep may resume on another one).

**Code, not text.** A Python file is hashed by its syntax tree with docstrings removed
(:func:`source_digest`): comments, docstrings, blank lines and formatting change no hash, any
change to what the code does does. jaxstale's own files are named by their path inside the
package, and the experiments sub-package (which a wheel installs inside the package folder, an
editable install beside it) is not part of ``source_sha``: the same code installed either way
has the same fingerprint.

**User code and what it calls.** A user object (a registered method builder, model builder,
dataset loader) is hashed with everything it reaches in its own module
(:func:`user_source_text`): the functions and classes named in its code that are defined in the
same module (followed recursively), the plain values (numbers, strings, tuples, ...) it reads
from module globals, and the functions and values captured in its closure. So editing a helper
that a registered lambda calls, or a module constant it reads, refuses the old results.
Library code it calls (optax, jax, jaxstale) is covered by the versions and ``source_sha``.

Hashing is cheap: every file is read and hashed once per process (the digest is cached under
its path, size and modification time, so an edited file is hashed again).

Example:
    >>> from experiments.runs import code_fingerprint, code_hash
    >>> fp = code_fingerprint(sources=["def build(hp): return hp"])
    >>> sorted(fp)
    ['backend', 'data_sha', 'experiment_sha', 'git_commit', 'host', 'jaxstale', 'source_sha',
     'user_sha', 'versions']
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

import ast
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
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import jax

import jaxstale

from .hosts import host_fingerprint

__all__ = [
    "RESULT_PARTS",
    "backend_fingerprint",
    "code_changes",
    "code_fingerprint",
    "code_hash",
    "git",
    "git_head",
    "source_digest",
    "user_source_text",
    "xla_flag",
]

PACKAGE_DIR = Path(jaxstale.__file__).resolve().parent  # the library, hashed as source_sha

#: The fingerprint entries that decide whether cached results are still valid: a dotted path
#: into the fingerprint dict -> the name used in messages.
RESULT_PARTS: dict[str, str] = {
    "source_sha": "jaxstale source",
    "experiment_sha": "experiment source",
    "user_sha": "user sources",
    "data_sha": "dataset content",
    "versions.jax": "jax",
    "versions.jaxlib": "jaxlib",
    "versions.optax": "optax",
    "versions.flax": "flax",
    "backend.platform": "backend",
    "backend.device": "device",
    "backend.matmul_precision": "matmul precision",
    "backend.deterministic_ops": "GPU deterministic ops",
}

_VERSIONED = ("jax", "jaxlib", "optax", "flax", "numpy")

# The sub-package that a wheel installs inside the jaxstale folder (an editable install maps it
# to the checkout's experiments/): hashed as the experiment's modules, never as jaxstale source.
_NOT_SOURCE = ("experiments",)

# (resolved path, size, mtime_ns) -> sha256 digest of the file's code
_FILE_DIGESTS: dict[tuple[str, int, int], bytes] = {}


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def source_digest(text: str) -> str:
    """The sha256 of Python source *code*: its syntax tree without docstrings.

    Comments, docstrings, blank lines, indentation of the whole text and formatting do not
    change it; any change to the code does. Text that does not parse (e.g. the source line of a
    lambda cut out of a longer expression) is hashed as it is.

    Args:
      text: Python source.

    Returns:
      The hex digest.

    Example:
      >>> a = source_digest("def f(x):\\n    'Doc.'\\n    return x + 1  # one\\n")
      >>> a == source_digest("def f(x):\\n\\n    return (x +\\n            1)\\n")
      True
      >>> a == source_digest("def f(x):\\n    return x + 2\\n")
      False
    """
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return hashlib.sha256(text.encode()).hexdigest()
    dump = ast.dump(_strip_docstrings(tree), annotate_fields=False, include_attributes=False)
    return hashlib.sha256(dump.encode()).hexdigest()


def _file_digest(path: Path) -> bytes:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    digest = _FILE_DIGESTS.get(key)
    if digest is None:
        raw = path.read_bytes()
        try:
            digest = bytes.fromhex(source_digest(raw.decode()))
        except UnicodeDecodeError:
            digest = hashlib.sha256(raw).digest()
        _FILE_DIGESTS[key] = digest
    return digest


def _py_files(folder: Path, skip: tuple[str, ...] = ()) -> list[tuple[str, Path]]:
    """Every ``.py`` file under ``folder`` (no caches, no hidden folders, no top-level folder
    named in ``skip``), by relative path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        top = Path(dirpath) == folder
        dirnames[:] = [
            d
            for d in dirnames
            if d != "__pycache__" and not d.startswith(".") and not (top and d in skip)
        ]
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

# Values read from a module's globals that are recorded by ``repr`` (plain data).
_PLAIN = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, list, dict, set)


def _own_text(obj: Any) -> str:
    """The text of one object: its source when it has one (hashed as code), else its compiled
    code, else a stable ``repr``."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, functools.partial):
        return "partial(" + "|".join(
            [_own_text(obj.func), repr(obj.args), repr(sorted(obj.keywords.items()))]
        )
    try:
        return "code:" + source_digest(inspect.getsource(obj))
    except (OSError, TypeError):
        pass
    code = getattr(obj, "__code__", None)
    if code is not None:  # e.g. defined at an interactive prompt: its compiled code
        name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        return name + ":" + marshal.dumps(code).hex()
    return _ADDRESS.sub("", repr(obj))  # addresses change from one process to the next


def _defaults(obj: Any) -> str:
    """A function's default argument values (set when its ``def`` ran, not in its code)."""
    func = getattr(obj, "__func__", obj)
    if not inspect.isfunction(func):
        return ""
    values = (func.__defaults__, func.__kwdefaults__)
    return "" if values == (None, None) else _ADDRESS.sub("", "defaults=" + repr(values))


def _names(code: Any) -> set[str]:
    """The global names a code object (and the functions, classes and lambdas it defines) read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _functions(obj: Any) -> list[Any]:
    """The Python functions inside ``obj``: itself, a partial's function, a class's methods."""
    if isinstance(obj, functools.partial):
        return [*_functions(obj.func), *(a for a in obj.args if callable(a))]
    if inspect.isclass(obj):
        found = []
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)  # staticmethod / classmethod
            if isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value):
                found.append(value)
        return found
    func = getattr(obj, "__func__", obj)  # a bound method
    return [func] if inspect.isfunction(func) else []


def _same_module(value: Any, home: dict[str, Any]) -> bool:
    """Whether ``value`` is a function or class defined in the module whose globals are
    ``home``."""
    if inspect.isfunction(value):
        return value.__globals__ is home
    if inspect.isclass(value):
        return getattr(value, "__module__", None) == home.get("__name__")
    return False


@functools.cache
def _library_roots() -> tuple[Path, ...]:
    """Folders whose modules are not the user's: the standard library, installed packages,
    jaxstale and the experiments (covered by the versions and the source hashes)."""
    import sysconfig

    paths = sysconfig.get_paths()
    found = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return (*sorted(found), PACKAGE_DIR, Path(__file__).resolve().parents[1])


def _user_module(value: Any) -> bool:
    """Whether ``value`` is a module of the user's own (a file outside :func:`_library_roots`),
    e.g. ``import mymethods as u`` in the module of a registered builder."""
    file = getattr(value, "__file__", None) if isinstance(value, ModuleType) else None
    if not file:
        return False
    path = Path(file).resolve()
    return not any(path.is_relative_to(root) for root in _library_roots())


def user_source_text(obj: Any) -> str:
    """The text that stands for a user object in a fingerprint: its own code and what it
    reaches in its module.

    Starting from ``obj`` (a function, lambda, class, ``functools.partial``, bound method or
    string), collects every function or class of the same module named in its code, in its
    closure or among a partial's arguments (recursively), and the plain values (numbers,
    strings, containers) it reads from module globals or its closure; through a module of the
    user's own that it names (``import mymethods as u``; ``u.damp(...)``: a file outside the
    standard library, the installed packages and jaxstale), the functions, classes and values of
    that module it names, the same way. Each function or class counts by its code
    (:func:`source_digest`: not its comments or docstrings); objects without source text by
    their compiled code or a stable ``repr``. Library modules and their objects (optax, jax,
    jaxstale) are not followed: their versions and ``source_sha`` cover them.

    Args:
      obj: the user object.

    Returns:
      A text that changes whenever the code or values it depends on change.

    Example:
      >>> scale = 0.5
      >>> def helper(g):
      ...     return g * scale
      >>> build = lambda hp: helper(hp)
      >>> before = user_source_text(build)
      >>> scale = 0.9  # a value a helper reads changed: so does the text
      >>> user_source_text(build) == before
      False
    """
    seen: dict[int, Any] = {}
    parts: list[str] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen[id(item)] = item  # keep it alive so its id is not reused
        parts.append(_own_text(item) + _defaults(item))
        for func in _functions(item):
            home = func.__globals__
            reached: list[tuple[str, Any]] = [
                (name, home[name]) for name in sorted(_names(func.__code__)) if name in home
            ]
            cells = zip(func.__code__.co_freevars, func.__closure__ or (), strict=False)
            for name, cell in cells:
                try:
                    reached.append((name, cell.cell_contents))
                except ValueError:  # an empty cell
                    continue
            names = sorted(_names(func.__code__))
            for name, value in reached:
                if _same_module(value, home) or (
                    inspect.isfunction(value) and value.__globals__ is home
                ):
                    stack.append(value)
                elif isinstance(value, _PLAIN):
                    parts.append(f"{name}={_ADDRESS.sub('', repr(value))}")
                elif _user_module(value):  # u.damp: what it names in the user's other module
                    for attr in names:
                        member = getattr(value, attr, None)
                        if _same_module(member, vars(value)):
                            stack.append(member)
                        elif isinstance(member, _PLAIN) and attr in vars(value):
                            parts.append(f"{name}.{attr}={_ADDRESS.sub('', repr(member))}")
    return "\n".join(parts)


def _source_text(obj: Any) -> str:
    """A user object's fingerprint text (:func:`user_source_text`)."""
    return user_source_text(obj)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git(folder: str | os.PathLike[str], *args: str) -> str | None:
    """Standard output of ``git -C folder *args``; None when git is missing, fails or hangs.

    Never raises, and ignores the caller's ``GIT_*`` variables (a hook's ``GIT_DIR`` would
    otherwise point every folder at one repository).

    Example:
      >>> import tempfile
      >>> with tempfile.TemporaryDirectory() as d:
      ...     git(d, "rev-parse", "--verify", "-q", "HEAD") is None  # not a repository
      True
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=20,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_head(folder: str | os.PathLike[str]) -> str | None:
    """HEAD of the git repository holding ``folder``; None when there is none (never raises)."""
    commit = (git(folder, "rev-parse", "--verify", "-q", "HEAD") or "").strip()
    return commit if re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def xla_flag(name: str, flags: str | None = None) -> str | None:
    """The value of ``--name`` in ``flags`` (default: the environment's ``XLA_FLAGS``; the last
    one wins, a bare ``--name`` is ``"true"``), or None when it is not named.

    Example:
      >>> xla_flag("xla_b", "--xla_a=1 --xla_b=false --xla_b"), xla_flag("xla_c", "--xla_a=1")
      ('true', None)
    """
    value = None
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    for flag in flags.split():
        key, _, val = flag.lstrip("-").partition("=")
        if key == name:
            value = val or "true"
    return value


def backend_fingerprint() -> dict[str, Any]:
    """What computes the numbers, beside the code: ``{"platform", "device", "matmul_precision",
    "deterministic_ops"}``.

    ``platform`` is ``jax.default_backend()`` (``cpu``, ``gpu``, ``tpu``), ``device`` the first
    device's kind (``cpu``, ``NVIDIA H200``), ``matmul_precision`` jax's
    ``jax_default_matmul_precision`` (``None``: the backend's default — TF32 for float32 dots on
    recent NVIDIA GPUs) and ``deterministic_ops`` the ``--xla_gpu_deterministic_ops`` of
    ``XLA_FLAGS`` on a GPU (None elsewhere: it changes nothing there). Measured on one H200
    (``benchmarks/results/gpu/``): an LM pipeline cell's loss after 40 updates moves by up to
    8.7e-5 between the CPU and the GPU at the default precision, by 2.4e-7 at ``"highest"``,
    and by 1e-5 between two GPU runs unless deterministic ops are on — so a sweep never mixes
    cells of two backends.

    Example:
      >>> b = backend_fingerprint()
      >>> sorted(b), b["platform"] == jax.default_backend()
      (['deterministic_ops', 'device', 'matmul_precision', 'platform'], True)
    """
    platform_name = jax.default_backend()
    precision = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
    deterministic = xla_flag("xla_gpu_deterministic_ops") if platform_name == "gpu" else None
    return {
        "platform": platform_name,
        "device": jax.devices()[0].device_kind,
        "matmul_precision": None if precision is None else str(precision),
        "deterministic_ops": deterministic,
    }


def code_fingerprint(
    *,
    modules: Iterable[ModuleType | str | os.PathLike[str]] = (),
    sources: Iterable[Any] = (),
    data: Iterable[str] = (),
) -> dict[str, Any]:
    """Describes the code that computes a run: source hashes, data digests, library versions,
    git commit.

    Args:
      modules: the experiment's own source: module objects (a package counts with all its
        ``.py`` files), or paths of files or folders. Pass the experiment module and the helper
        modules it uses, e.g. ``modules=(sys.modules[__name__], common)``. The first one also
        locates the git repository. Files are named by their base name (folders by their
        relative paths), so the same code checked out elsewhere gives the same hash.
      sources: user code the results depend on that lives outside jaxstale and the experiment,
        e.g. the builders of user-registered methods, models and dataset loaders. Each item is
        a string (taken as source text) or any object, with what it calls and reads in its own
        module (:func:`user_source_text`). The order of the items does not matter.
      data: content digests of the datasets the run reads (e.g.
        ``Dataset.preprocessing["digest"]`` from :func:`jaxstale.data.load`); order-free.

    Returns:
      ``{"jaxstale": version, "source_sha": sha256 of every .py file of the jaxstale package
      (sorted by relative path), "experiment_sha": sha256 of ``modules``' files (None if none
      given), "user_sha": sha256 of ``sources`` (None if none given), "data_sha": sha256 of
      ``data`` (None if none given), "versions": {"jax",
      "jaxlib", "optax", "flax", "numpy", "python"}, "backend": :func:`backend_fingerprint`,
      "git_commit": HEAD of the repository of the
      first module (else of the jaxstale package), or None when not in a git checkout or git is
      missing, "host": the machine (:func:`~experiments.runs.hosts.host_fingerprint`)}``. Plain
      JSON; :func:`code_hash` condenses the parts that decide results (not the host).

    Raises:
      ValueError: a module has no source file, or a path does not exist.

    Every ``.py`` file counts by its code (:func:`source_digest`): comments and docstrings do
    not change a fingerprint. The package's ``experiments`` sub-package (inside the package
    folder in a wheel, beside it in a checkout) is not part of ``source_sha``.

    Example:
      >>> fp = code_fingerprint()
      >>> len(fp["source_sha"]), fp["user_sha"], fp["versions"]["python"].count(".")
      (64, None, 2)
    """
    files = [f for m in modules for f in _module_files(m)]
    user = sorted(hashlib.sha256(_source_text(s).encode()).hexdigest() for s in sources)
    digests = sorted(set(map(str, data)))
    where = files[0][1].parent if files else PACKAGE_DIR
    return {
        "jaxstale": _version("jaxstale"),
        "source_sha": _hash_files(_py_files(PACKAGE_DIR, skip=_NOT_SOURCE)),
        "experiment_sha": _hash_files(files) if files else None,
        "user_sha": hashlib.sha256("\n".join(user).encode()).hexdigest() if user else None,
        "data_sha": hashlib.sha256("\n".join(digests).encode()).hexdigest() if digests else None,
        "versions": {
            **{name: _version(name) for name in _VERSIONED},
            "python": platform.python_version(),
        },
        "backend": backend_fingerprint(),
        "git_commit": git_head(where),
        "host": host_fingerprint(),
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
            named = dotted.startswith(("versions.", "backend."))
            changed.append(f"{label} {a} -> {b}" if named else label)
    return changed
