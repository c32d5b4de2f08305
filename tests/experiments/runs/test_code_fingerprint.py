"""Code fingerprints: source hashes, versions, git commit; stable, cheap, never failing."""

import functools
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys

import jax
import pytest

from experiments import runs
from experiments.runs import fingerprint


def _build(hp):
    return hp * 2


def _build_changed(hp):
    return hp * 3


def _fp(*sources):
    return runs.code_fingerprint(sources=sources)


def test_fingerprint_fields_versions_and_cache(tmp_path):
    fp = runs.code_fingerprint()
    assert set(fp) == {
        "jaxstale",
        "source_sha",
        "experiment_sha",
        "user_sha",
        "data_sha",
        "versions",
        "backend",
        "git_commit",
        "host",
    }
    for name in ("jax", "jaxlib", "optax", "flax", "numpy"):
        assert fp["versions"][name] == importlib.metadata.version(name)
    assert fp["versions"]["python"] == platform.python_version()
    assert fp["jaxstale"] == importlib.metadata.version("jaxstale")
    assert len(fp["source_sha"]) == 64 and fp["experiment_sha"] is None and fp["user_sha"] is None
    assert fp["data_sha"] is None
    assert runs.code_fingerprint() == fp  # deterministic
    json.dumps(fp)  # plain JSON

    exp = tmp_path / "exp.py"
    exp.write_text("X = 1\n")
    a = runs.code_fingerprint(modules=[exp])["experiment_sha"]
    assert a is not None and runs.code_fingerprint(modules=[str(exp)])["experiment_sha"] == a
    exp.write_text("X = 1  # a comment\n\n")  # comments and blank lines are not code
    assert runs.code_fingerprint(modules=[exp])["experiment_sha"] == a
    exp.write_text("X = 22\n")  # an edited file is hashed again (size/mtime changed)
    assert runs.code_fingerprint(modules=[exp])["experiment_sha"] != a
    with pytest.raises(ValueError, match="not a file or folder"):
        runs.code_fingerprint(modules=[tmp_path / "missing.py"])


def test_user_sources_use_the_source_text_and_stable_fallbacks():
    assert _fp(_build) == _fp(_build)
    assert _fp(_build)["user_sha"] != _fp(_build_changed)["user_sha"]
    assert _fp(_build, _build_changed) == _fp(_build_changed, _build)  # order-free
    assert _fp(functools.partial(_build, 1)) != _fp(functools.partial(_build, 2))

    class Opaque:  # no source text available for instances: repr without the address
        pass

    assert _fp(Opaque()) == _fp(Opaque())
    compiled = {}
    exec(compile("def f(x):\n    return x + 1\n", "<prompt>", "exec"), compiled)
    assert _fp(compiled["f"])["user_sha"] is not None  # no source file: its compiled code


def test_code_hash_ignores_git_commit_and_names_changes():
    fp = _fp(_build)
    assert runs.code_hash(fp) == runs.code_hash({**fp, "git_commit": "f" * 40})
    changed = {**fp, "versions": {**fp["versions"], "jax": "9.9"}}
    assert runs.code_hash(changed) != runs.code_hash(fp)
    assert runs.code_changes(fp, changed) == [f"jax {fp['versions']['jax']} -> 9.9"]
    assert runs.code_changes(fp, _fp(_build_changed)) == ["user sources"]
    assert "no code fingerprint" in runs.code_changes(None, fp)[0]


def test_the_backend_decides_results(monkeypatch):
    fp = runs.code_fingerprint()
    device = jax.devices()[0].device_kind
    assert fp["backend"] == {
        "platform": "cpu", "device": device, "matmul_precision": None, "deterministic_ops": None
    }  # fmt: skip
    gpu = {**fp, "backend": {**fp["backend"], "platform": "gpu", "device": "NVIDIA H200"}}
    assert runs.code_hash(gpu) != runs.code_hash(fp)
    assert runs.code_changes(fp, gpu) == ["backend cpu -> gpu", f"device {device} -> NVIDIA H200"]
    old = {k: v for k, v in fp.items() if k != "backend"}  # written before the backend counted
    assert runs.code_changes(old, fp)[0] == "backend None -> cpu"
    with jax.default_matmul_precision("highest"):
        assert runs.code_fingerprint()["backend"]["matmul_precision"] == "highest"
    # the GPU flag is read from XLA_FLAGS (the last one wins), and counts only on a GPU
    monkeypatch.setenv(
        "XLA_FLAGS", "--a=1 --xla_gpu_deterministic_ops=false --xla_gpu_deterministic_ops"
    )
    assert fingerprint.xla_flag("xla_gpu_deterministic_ops") == "true"
    assert fingerprint.xla_flag("xla_missing") is None
    assert runs.backend_fingerprint()["deterministic_ops"] is None  # on the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert runs.backend_fingerprint()["deterministic_ops"] == "true"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_recorded_in_a_git_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "exp.py").write_text("X = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "exp.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert runs.code_fingerprint(modules=[repo / "exp.py"])["git_commit"] == head
    outside = tmp_path / "plain"
    outside.mkdir()
    (outside / "exp.py").write_text("X = 1\n")
    assert runs.code_fingerprint(modules=[outside / "exp.py"])["git_commit"] is None


def test_git_commit_is_none_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable found
    assert runs.code_fingerprint()["git_commit"] is None


def test_code_not_comments_or_docstrings_decides():
    base = "def f(x):\n    return x + 1\n"
    same = [
        'def f(x):\n    """Adds one."""\n    return x + 1\n',
        "# header\ndef f(x):  # inline\n\n    return (x +\n            1)\n",
        '"""Module docstring."""\n' + base,
    ]
    for text in same:
        assert runs.source_digest(text) == runs.source_digest(base), text
    for text in ("def f(x):\n    return x + 2\n", "def f(y):\n    return y + 1\n"):
        assert runs.source_digest(text) != runs.source_digest(base), text
    assert runs.source_digest("lambda hp: (") != runs.source_digest("lambda hp: [")  # unparsable


def test_same_code_installed_as_a_wheel_or_editable_has_one_fingerprint(tmp_path, monkeypatch):
    """A wheel puts the experiments sub-package inside the package folder: it is not part of
    jaxstale's source hash (it is hashed as the experiment's modules)."""
    from experiments.runs import fingerprint

    pkg = tmp_path / "jaxstale"
    pkg.mkdir()
    (pkg / "core.py").write_text("def f():\n    return 1\n")
    monkeypatch.setattr(fingerprint, "PACKAGE_DIR", pkg)
    editable = runs.code_fingerprint()["source_sha"]
    (pkg / "experiments").mkdir()
    (pkg / "experiments" / "exp.py").write_text("X = 1\n")
    assert runs.code_fingerprint()["source_sha"] == editable
    (pkg / "core.py").write_text('"""Doc."""\n\n\ndef f():  # same code\n    return 1\n')
    assert runs.code_fingerprint()["source_sha"] == editable
    (pkg / "core.py").write_text("def f():\n    return 2\n")
    assert runs.code_fingerprint()["source_sha"] != editable


def test_data_digests_are_a_result_part():
    a = runs.code_fingerprint(data=["d1"])
    assert a["data_sha"] is not None and runs.code_fingerprint(data=["d1", "d1"]) == a
    b = runs.code_fingerprint(data=["d2"])
    assert runs.code_hash(a) != runs.code_hash(b)
    assert runs.code_changes(a, b) == ["dataset content"]


_SCALE = 0.5


def _helper(g):
    return g * _SCALE


def _uses_helper(hp):
    return _helper(hp)


def test_user_code_covers_helpers_and_values_it_reaches(monkeypatch):
    """A registered lambda calling a helper of its module: editing the helper, a constant it
    reads, or a value in a closure changes the fingerprint (issue 21: 'c' 0.5 -> 0.9)."""
    build = lambda hp: _uses_helper(hp)
    before = _fp(build)
    monkeypatch.setattr(sys.modules[__name__], "_SCALE", 0.9)
    assert _fp(build) != before
    monkeypatch.setattr(sys.modules[__name__], "_SCALE", 0.5)
    assert _fp(build) == before

    def replaced(g):
        return g * 3

    monkeypatch.setattr(sys.modules[__name__], "_helper", replaced)
    assert _fp(build) != before

    def closure(c):
        return lambda hp: hp * c

    assert _fp(closure(0.5)) != _fp(closure(0.9))
    assert _fp(closure(0.5)) == _fp(closure(0.5))


def test_user_code_follows_class_methods():
    class Model:
        def __call__(self, x):
            return _helper(x)

    text = runs.user_source_text(Model)
    assert "_SCALE=0.5" in text


def test_user_code_follows_a_helper_in_the_users_second_module(tmp_path, monkeypatch):
    """The common layout: ``import mymethods as u`` and a builder calling ``u.damp``. Editing
    ``u.damp`` (or a constant it reads) re-ran into the same folder and reused the old numbers:
    only the builder's own module was followed (issue 51)."""
    import importlib

    helper = tmp_path / "mymethods_fp_test.py"
    helper.write_text("C = 0.5\n\ndef damp(g):\n    return g * C\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    u = importlib.import_module("mymethods_fp_test")
    build = lambda hp: u.damp(hp)  # the user's lambda, in this (other) module
    monkeypatch.setitem(globals(), "u", u)
    before = _fp(build)
    helper.write_text("C = 0.5\n\ndef damp(g):\n    return g * C * 2\n")
    importlib.reload(u)
    assert _fp(build) != before  # the helper's code
    helper.write_text("C = 0.9\n\ndef damp(g):\n    return g * C\n")
    importlib.reload(u)
    changed = _fp(build)
    assert changed != before  # a value it reads
    helper.write_text("C = 0.5\n\ndef damp(g):\n    return g * C  # a comment\n")
    importlib.reload(u)
    assert _fp(build) == before  # comments change nothing
    # library modules are not followed: their versions and source hashes cover them
    assert not fingerprint._user_module(json) and not fingerprint._user_module(runs)
