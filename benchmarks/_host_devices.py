"""Emulated CPU devices for the mesh benchmarks, set up before jax is imported.

``emulate()`` adds ``--xla_force_host_platform_device_count=8`` to ``XLA_FLAGS`` when the user
chose no device count and no platform other than the CPU, and no accelerator plugin of jax is
installed (on a GPU machine the benchmarks then use the GPUs). Import this module, and call
``emulate()``, before anything imports jax.
"""

from __future__ import annotations

import os


def wanted() -> bool:
    """Whether to emulate 8 CPU devices (see the module docstring)."""
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return False
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms == "cpu"
    from importlib import metadata

    names = [(d.metadata["Name"] or "").lower() for d in metadata.distributions()]
    accel = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu")
    return not any(n.startswith(accel) for n in names)


def emulate(count: int = 8) -> None:
    """Emulate ``count`` CPU devices if :func:`wanted`."""
    if wanted():
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
