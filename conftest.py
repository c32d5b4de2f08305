"""Root pytest set-up, shared by ``tests/`` and the doctests in ``jaxstale/``.

Runs before any test module (or any ``jaxstale`` module collected for ``--doctest-modules``)
imports jax, so the doctests see the same world as the tests: 8 emulated CPU devices and a
compile cache of this pytest process. Being at the root, it also applies to runs started on a
single test file or from inside ``tests/``.

The compile cache: JAX's persistent cache in a temporary folder that lives as long as this
process, so a program compiled again by another jitted function of the same test run (every
experiment builds its own; a resumed sweep recompiles what it ran) is read back instead. It is
never shared between processes: reading an XLA:CPU executable written by another process (an
earlier test run, the ``make test`` before ``make test-slow``) crashed pytest with a segfault in
``jax``'s cache read. ``JAXSTALE_TEST_JIT_CACHE=off`` turns it off (``make test-slow`` does).

XLA:CPU's backend optimization level: 0 (below), ``JAXSTALE_TEST_XLA_O0=off`` for the default.
"""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
# LLVM at -O0 for XLA:CPU's generated code: compiling is most of this suite's time (a GRPO
# run's program: 9.0 s at the default level, 5.3 s at 0), the programs run for a few steps
# each, and what the tests check (hand-computed cases, reductions, one executor against the
# other bit for bit) is the program's arithmetic, which the level does not change beyond the
# rounding of a fused product (one tolerance widened for it). Measured on 2 cores beside the
# same two sweeps (two runs, hours apart, not paired): the whole suite in 768.8 s at the
# default level, 570.8 s at 0. `make test-slow` (JAXSTALE_TEST_XLA_O0=off) runs at the default
# level, as users do.
if os.environ.get("JAXSTALE_TEST_XLA_O0", "on") != "off" and "optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import atexit  # noqa: E402
import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

if os.environ.get("JAXSTALE_TEST_JIT_CACHE", "process") != "off":
    _cache = tempfile.mkdtemp(prefix="jaxstale-test-jit-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


class _CheckoutExperiments(importlib.abc.MetaPathFinder):
    """``jaxstale.experiments`` is this checkout's ``experiments/`` folder, as in the wheel.

    An editable install of this checkout maps it so too, but the tests may run in a virtualenv
    installed from another checkout (which maps it to that one's folder, or not at all); the
    tests, like ``jaxstale`` itself (``pythonpath = ["."]``), use this checkout's files.
    """

    FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments")

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "jaxstale.experiments":
            return None
        return importlib.util.spec_from_file_location(
            fullname,
            os.path.join(self.FOLDER, "__init__.py"),
            submodule_search_locations=[self.FOLDER],
        )


sys.meta_path.insert(0, _CheckoutExperiments())


@pytest.fixture(autouse=True)
def _stable_print_options(request: pytest.FixtureRequest):
    """Doctests print with numpy's default options, whatever an earlier test changed."""
    if isinstance(request.node, pytest.DoctestItem):
        with np.printoptions(precision=8, suppress=False, threshold=1000, linewidth=75):
            yield
    else:
        yield


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that tries to open a network connection (TFDS paths use mock data)."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
