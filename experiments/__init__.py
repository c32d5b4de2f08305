"""The experiment scripts, one question each.

In a checkout this folder is the package ``experiments`` (``python -m experiments.<name>``); the
wheel ships the same files as ``jaxstale.experiments`` (the ``jaxstale <name>`` command), so the
scripts import their shared helpers relatively (``from .common import ...``).
"""

import os as _os
import warnings as _warnings
from collections.abc import Callable as _Callable
from collections.abc import MutableMapping as _MutableMapping

from .runs.fingerprint import xla_flag as _xla_flag  # how the fingerprint reads it


def _gpu_already_running() -> bool:
    """Whether jax's backends started (their XLA_FLAGS read) before this call, on a GPU."""
    try:
        from jax._src import xla_bridge  # no public test for "initialised" without starting one

        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # pragma: no cover - a jax without it: assume not
        return False
    import jax

    return bool(started) and jax.default_backend() == "gpu"


def deterministic_gpu_ops(
    environ: _MutableMapping[str, str] = _os.environ,
    gpu_running: _Callable[[], bool] = _gpu_already_running,
) -> None:
    """Ask XLA for deterministic GPU kernels (``--xla_gpu_deterministic_ops=true`` in
    ``XLA_FLAGS``) unless the flag is already there, either way.

    On a GPU, XLA's scatter-adds (an embedding's gradient) and some reductions run in an order
    that changes from run to run: measured on one H200, two runs of the same LM pipeline cells
    were up to 1e-5 apart in loss after 40 updates, and bit for bit equal with this flag
    (``benchmarks/results/gpu/``). A resumed sweep recomputes a missing cell with its whole
    group and must get the numbers a fresh run gives, so the experiments ask for it; XLA reads
    the flag when jax first computes, which importing this package precedes. On a CPU it
    changes nothing. Set ``--xla_gpu_deterministic_ops=false`` to trade that for speed (the
    run folders record it: :func:`experiments.runs.backend_fingerprint`).

    Where a GPU backend already started (a notebook that computed with jax before importing
    the experiments), XLA has read its flags: the flag is then left out, so the fingerprint,
    which reads ``XLA_FLAGS``, records what the backend runs with, and a warning says how to
    get it (set it before jax first computes, or restart).
    """
    flags = environ.get("XLA_FLAGS", "")
    if _xla_flag("xla_gpu_deterministic_ops", flags) is not None:
        return
    if gpu_running():
        _warnings.warn(
            "jax's GPU backend started before jaxstale's experiments were imported, so XLA will "
            "not read --xla_gpu_deterministic_ops=true: GPU runs may differ in the last digits "
            "from run to run (set XLA_FLAGS before jax first computes to get bit-for-bit runs)",
            stacklevel=2,
        )
        return
    environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()


deterministic_gpu_ops()
