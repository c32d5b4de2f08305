"""Which machine computed a cell: recorded for the reader, never part of the code hash.

On XLA:CPU a cell is bit for bit the same whether its runs are vmapped lanes, computed one at a
time or on the mesh executor (docs/reproducibility.md) — on one machine. The code hash
(:func:`~experiments.runs.code_hash`) names the backend as jax does (``cpu``), which does not tell
two CPUs apart, and a sweep that spans sessions can resume on another machine. Measured in this
project: the 27,000-update ``pipeline`` claims run kept cells of one configuration and code hash
from two sessions, and recomputing here the synchronous policy's cells of the first (N = 4,
seed 0, rate 0.01, alone or as any of 1–20 vmapped lanes) gives 84.74 % test accuracy where the
stored cell says 85.64 % (their training losses already 1.6318 and 1.6295 at update 450); its
cells from the second session agree with the recompute bit for bit. What differed between the two
sessions is not known (not the lanes, the host device count, XLA's ``--xla_cpu_max_isa`` or
NumPy's dispatched ISA: each was varied here without changing a bit). Seeds still pair (a seed
fixes initial weights and data order on every machine), and two such cells differ as two runs a
last bit apart do, but not bit for bit.

So :func:`host_fingerprint` describes the machine — its CPU model and identification, the
instruction-set flags it reports, its core count — and its short :func:`host_fingerprint` ``id``
goes into every cell a :class:`~experiments.runs.RunFolder` records (``"host"``); a run folder
that resumes cells computed on another machine says so in one line (:func:`other_host_note`).
Cells written before this was recorded carry no ``host``: they are not counted.

Example:
    >>> fp = host_fingerprint()
    >>> sorted(fp), len(fp["id"])
    (['cores', 'cpu', 'id', 'machine'], 12)
    >>> host_fingerprint() == fp
    True
    >>> cells = [{"host": fp["id"]}, {"host": "0123456789ab"}, {}]
    >>> other_host_note("demo", cells, fp)
    '[demo] 1 of 2 finished cells that record their machine were computed on another one (...'
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["fmt_bytes", "host_fingerprint", "machine_memory", "other_host_note"]

#: the fields of ``/proc/cpuinfo``'s first processor that name the CPU (x86, then ARM)
_CPU_FIELDS = ("model name", "cpu family", "model", "stepping", "CPU implementer", "CPU part")


def _cpuinfo(text: str) -> dict[str, str]:
    """The first processor block of ``/proc/cpuinfo`` as ``{field: value}``."""
    out: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out.setdefault(name.strip(), value.strip())
    return out


@functools.cache
def host_fingerprint(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> dict[str, Any]:
    """``{"id", "machine", "cpu", "cores"}`` of this machine: ``cpu`` its model and
    identification from ``cpuinfo`` (where it exists: Linux) or :func:`platform.processor`,
    ``id`` the first 12 hex characters of the SHA-256 of the machine type, that identification
    and the sorted instruction-set flags the CPU reports (``flags`` / ``Features``), so two
    machines whose CPUs differ only in the extensions they offer get two ids."""
    try:
        info = _cpuinfo(Path(cpuinfo).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        info = {}
    named = [f"{k} {info[k]}" for k in _CPU_FIELDS if info.get(k)]
    cpu = ", ".join(named) or platform.processor() or "unknown"
    flags = " ".join(sorted((info.get("flags") or info.get("Features") or "").split()))
    ident = "\n".join([platform.machine(), cpu, flags])
    return {
        "id": hashlib.sha256(ident.encode()).hexdigest()[:12],
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": os.cpu_count(),
    }


def other_host_note(
    experiment: str, cells: Iterable[Mapping[str, Any]], host: Mapping[str, Any] | None
) -> str:
    """One line when some of ``cells`` record a machine other than ``host`` (a
    :func:`host_fingerprint`); empty otherwise (cells without ``"host"`` are not counted)."""
    ids = [c.get("host") for c in cells]
    known = [h for h in ids if h]
    here = (host or {}).get("id")
    other = sum(h != here for h in known)
    if not other:
        return ""
    return (
        f"[{experiment}] {other} of {len(known)} finished cells that record their machine were "
        f"computed on another one (this one: {(host or {}).get('cpu')}); on XLA:CPU a cell is "
        "the same bit for bit on one machine, not across machines (experiments.runs.hosts)"
    )


def machine_memory() -> int:
    """Bytes of memory this process may use: the least of the machine's physical memory
    (``os.sysconf``), the process's address-space and data limits (``ulimit -v`` / ``-d``:
    ``RLIMIT_AS``, ``RLIMIT_DATA``) and its cgroup's ``memory.max`` (a container's limit);
    2**62 where none is known. Before, only the machine's RAM was read, so a process under a
    smaller limit passed the check and was killed mid-run, leaving a run folder."""
    found = [1 << 62]
    try:
        found.append(int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES")))
    except (AttributeError, ValueError, OSError):
        pass
    try:
        import resource

        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                found.append(int(soft))
    except (ImportError, AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            found.append(int(text))
    except OSError:
        pass
    return min(found)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"
