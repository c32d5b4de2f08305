"""The measured default of how :func:`jaxstale.train.fit` loops its steps and seeds.

Defaults for ``loop="auto"`` / ``seed_mode="auto"``, ``(backend, model) -> (loop, seed_mode)``,
measured by ``benchmarks/loop_strategies.py`` on the 2-core XLA:CPU box (its table is in
docs/benchmarks.md). Re-exported by :mod:`jaxstale.train`.
"""

from __future__ import annotations

import jax

__all__ = ["AUTO_STRATEGY", "LOOPS", "SEED_MODES", "default_strategy"]

LOOPS: tuple[str, ...] = ("host", "scan", "unrolled")
SEED_MODES: tuple[str, ...] = ("vmap", "sequential")

# Defaults for loop="auto" / seed_mode="auto", (backend, model) -> (loop, seed_mode), measured by
# benchmarks/loop_strategies.py on the 2-core XLA:CPU box (docs/benchmarks.md): MLPs gain
# from scans (no per-step dispatch) and vmap is break-even -> scan + vmap; convolutions lose 4x in
# a rolled scan and 3x under vmap at 28x28 (grouped convolutions) -> host + sequential, the
# choice that is never badly wrong; ResNet-20 likewise. No GPU was measured: on accelerators the
# default is scan + vmap (DESIGN: "vmap over seeds pays on GPUs"). Pass loop= / seed_mode=.
AUTO_STRATEGY: dict[tuple[str, str], tuple[str, str]] = {
    ("cpu", "mlp"): ("scan", "vmap"),
    ("cpu", "cnn"): ("host", "sequential"),
    ("cpu", "resnet20"): ("host", "sequential"),
}
_FALLBACK = {"cpu": ("host", "sequential")}  # unknown models on the CPU: the safe choice
_ACCELERATOR_DEFAULT = ("scan", "vmap")


def default_strategy(model: str, backend: str | None = None) -> tuple[str, str]:
    """The measured ``(loop, seed_mode)`` default for a model on a backend.

    Args:
      model: a model name from ``jaxstale.models.MODELS`` (others get the safe default).
      backend: ``"cpu"``, ``"gpu"``, ``"tpu"``; default ``jax.default_backend()``.

    Returns:
      ``(loop, seed_mode)``, e.g. ``("host", "sequential")`` for a CNN on the CPU.

    Example:
      >>> default_strategy("cnn", "cpu")
      ('host', 'sequential')
      >>> default_strategy("cnn", "gpu")
      ('scan', 'vmap')
    """
    backend = backend or jax.default_backend()
    if (backend, model) in AUTO_STRATEGY:
        return AUTO_STRATEGY[(backend, model)]
    return _FALLBACK.get(backend, _ACCELERATOR_DEFAULT)
