"""Atomic file writes with the umask's modes: the one writer of every file jaxstale keeps.

:func:`experiments.runs.atomic_write_bytes` adds the process rule (only process 0 of a group of
JAX processes writes run files) on top of :func:`write_atomically`; the data cache
(:mod:`jaxstale._mnist1d`) calls it directly, since each process may fill its own cache.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["write_atomically"]


def _create_temp(path: Path) -> tuple[int, Path]:
    """Creates a new hidden temporary file beside ``path`` with mode ``0o666 & ~umask``.

    (``tempfile.mkstemp`` would create it ``0o600`` whatever the umask, and ``os.replace`` keeps
    that mode.)
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path}")


def write_atomically(path: str | os.PathLike[str], data: bytes) -> Path:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    A reader sees either the old file or the complete new one, never a partial write; the file
    gets the mode an ordinary ``open(path, "wb")`` gives a new file (``0o666 & ~umask``); the
    temporary file is removed when the write fails. ``path``'s folder must exist.
    """
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
