"""The experiment scripts, one question each.

In a checkout this folder is the package ``experiments`` (``python -m experiments.<name>``); the
wheel ships the same files as ``jaxstale.experiments`` (the ``jaxstale <name>`` command), so the
scripts import their shared helpers relatively (``from .common import ...``).
"""

import os as _os
from collections.abc import MutableMapping as _MutableMapping

from jaxstale.runs.fingerprint import xla_flag as _xla_flag  # how the fingerprint reads it


def deterministic_gpu_ops(environ: _MutableMapping[str, str] = _os.environ) -> None:
    """Ask XLA for deterministic GPU kernels (``--xla_gpu_deterministic_ops=true`` in
    ``XLA_FLAGS``) unless the flag is already there, either way.

    On a GPU, XLA's scatter-adds (an embedding's gradient) and some reductions run in an order
    that changes from run to run: measured on one H200, two runs of the same LM pipeline cells
    were up to 1e-5 apart in loss after 40 updates, and bit for bit equal with this flag
    (``benchmarks/results/gpu/``). A resumed sweep recomputes a missing cell with its whole
    group and must get the numbers a fresh run gives, so the experiments ask for it; XLA reads
    the flag when jax first computes, which importing this package precedes. On a CPU it
    changes nothing. Set ``--xla_gpu_deterministic_ops=false`` to trade that for speed (the
    run folders record it: :func:`jaxstale.runs.backend_fingerprint`).
    """
    flags = environ.get("XLA_FLAGS", "")
    if _xla_flag("xla_gpu_deterministic_ops", flags) is None:
        environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()


deterministic_gpu_ops()
