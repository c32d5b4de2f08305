"""Token streams from disk, in nanoGPT's format: ``data.load("tokens", data_dir=DIR)``.

A folder of flat arrays of token ids, as nanoGPT's ``prepare.py`` scripts write them::

    train.bin    the training split: little-endian uint16 ids (uint32 where the vocabulary
                 has more than 65,536 ids), no header
    val.bin      the validation split, the same
    test.bin     optional: the test split; without it the validation file's first half is
                 the validation split and its second half the test split (said in the
                 dataset's ``preprocessing``: ``"test_from"``)
    meta.json    {"vocab_size": V, "dtype": "uint16" | "uint32", "context": T (optional)}
                 — or nanoGPT's meta.pkl ({"vocab_size": V, "itos": ..., "stoi": ...}, read
                 with an unpickler that admits only plain dicts, strings and numbers)

The files are read through ``np.memmap``: a run reads the windows its seed draws, never the whole
file (the pipeline and local-SGD experiments gather a run's windows into one compact copy,
:meth:`jaxstale.data.Indexed.compact`; the synchronous and asynchronous executors take their
training set as one array and copy it). Like the embedded text (:mod:`jaxstale.text`), a split is
cut into consecutive non-overlapping windows of ``T`` ids (``meta.json``'s ``"context"``, default
:data:`~jaxstale.text.CONTEXT`) with next-id targets; the validation split is scored on
:data:`~jaxstale.text.EVAL_WINDOWS` evenly spaced windows, the test split on all of its windows up
to :data:`TEST_WINDOWS` (beyond, that many evenly spaced: ``preprocessing["test_windows"]``).

**Checked before anything is computed**, each a one-line ``ValueError``: a missing folder or
file, a meta file without a positive ``vocab_size``, a dtype that is not uint16 / uint32 or
cannot hold the vocabulary, a file whose size is not a whole number of ids, a split shorter than
one window, and an id ``≥ vocab_size`` (a GPT built for the vocabulary would read past its
embedding table). The id check and the content digest (sha256 of every file, the dataset's part
of a run's fingerprint) share one pass over the files, cached in ``DIR/.jaxstale-digest.json``
by file size and modification time where the folder is writable: a second load reads no file
whole.

:func:`write` writes arrays in this format and :func:`write_text` the embedded Shakespeare corpus
(``python -m jaxstale.tokens DIR``), so the two paths are tested equal.

Example:
    >>> import tempfile, numpy as np
    >>> from jaxstale import data
    >>> d = write(tempfile.mkdtemp(), train=np.arange(700) % 50, val=np.arange(300) % 50,
    ...           vocab_size=50, context=8)
    >>> ds = data.load("tokens", data_dir=d)
    >>> ds.task, ds.num_classes, ds.x_train.shape, ds.x_val.shape, ds.x_test.shape
    ('language_model', 50, (87, 8), (18, 8), (18, 8))
    >>> ds.x_train[np.array([0, 2])][:, :3].tolist(), ds.preprocessing["test_from"]
    ([[0, 1, 2], [16, 17, 18]], 'val.bin, second half')
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxstale.text import CONTEXT, EVAL_WINDOWS, spaced

__all__ = ["TEST_WINDOWS", "TokenFiles", "Windows", "open_tokens", "write", "write_text"]

#: test windows scored at most (all of a test split up to this; 16,384 × 64 ≈ 1 M ids)
TEST_WINDOWS = 16384

_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_CACHE = ".jaxstale-digest.json"
_CHUNK = 1 << 24  # ids per pass of the digest


class Windows:
    """Consecutive non-overlapping windows of ``context`` ids of a flat id array, read lazily:
    ``w[idx]`` reads only the windows ``idx`` names (int32 ``[*idx.shape, context]``);
    ``shift=1`` gives each window's next-id targets. ``np.asarray(w)`` reads them all.

    Example:
        >>> w = Windows(np.arange(10, dtype=np.uint16), 3, shift=1)
        >>> w.shape, w[np.array([2, 0])].tolist()
        ((3, 3), [[7, 8, 9], [1, 2, 3]])
    """

    def __init__(self, ids: np.ndarray, context: int, shift: int = 0) -> None:
        self.ids, self.context, self.shift = ids, context, shift
        self.shape = ((len(ids) - 1) // context, context)
        self.dtype = np.dtype(np.int32)
        self.ndim = 2
        self.nbytes = self.shape[0] * context * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx: Any) -> np.ndarray:
        if isinstance(idx, slice):
            idx = np.arange(len(self))[idx]
        rows = np.asarray(idx)
        if not np.issubdtype(rows.dtype, np.integer):
            raise TypeError(f"Windows: index with integers, got {rows.dtype}")
        rows = np.where(rows < 0, rows + len(self), rows)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"Windows: an index outside [0, {len(self)})")
        at = rows[..., None] * self.context + self.shift + np.arange(self.context)
        return np.asarray(self.ids[at], np.int32)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[np.arange(len(self))]
        return out if dtype is None else out.astype(dtype)


@dataclass(frozen=True)
class TokenFiles:
    """An opened token folder (:func:`open_tokens`): the splits as memory maps."""

    directory: Path
    vocab_size: int
    dtype: np.dtype
    context: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray | None
    digest: str


class _PlainUnpickler(pickle.Unpickler):
    """nanoGPT's meta.pkl holds a dict of ints, strings and dicts: nothing else is built."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in meta.pkl")


def _meta(d: Path) -> dict[str, Any]:
    if (d / "meta.json").is_file():
        try:
            meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"tokens: {d / 'meta.json'} is not JSON ({e})") from None
    elif (d / "meta.pkl").is_file():
        try:
            meta = _PlainUnpickler(io.BytesIO((d / "meta.pkl").read_bytes())).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            raise ValueError(f"tokens: {d / 'meta.pkl'} is not a plain dict ({e})") from None
    else:
        raise ValueError(f"tokens: {d} has no meta.json or meta.pkl (the vocabulary size)")
    if not isinstance(meta, dict):
        raise ValueError(f"tokens: {d}'s meta file is not a mapping")
    return meta


def _check_int(meta: dict[str, Any], field: str, default: int | None, d: Path) -> int:
    v = meta.get(field, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"tokens: {d}'s meta file needs a positive integer {field!r}, got {v!r}")
    return v


def _scan(ids: np.ndarray) -> tuple[str, int]:
    """One pass: the file's sha256 and its largest id."""
    h, top = hashlib.sha256(), -1
    for a in range(0, len(ids), _CHUNK):
        part = np.ascontiguousarray(ids[a : a + _CHUNK])
        h.update(part.data)
        top = max(top, int(part.max()))
    return h.hexdigest(), top


def _scanned(d: Path, name: str, ids: np.ndarray) -> tuple[str, int]:
    """:func:`_scan`, cached by the file's size and modification time."""
    st = (d / name).stat()
    stamp = [st.st_size, st.st_mtime_ns]
    cache: dict[str, Any] = {}
    try:
        cache = json.loads((d / _CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    got = cache.get(name) if isinstance(cache, dict) else None
    if isinstance(got, dict) and got.get("stamp") == stamp:
        return str(got["sha256"]), int(got["max"])
    digest, top = _scan(ids)
    cache = cache if isinstance(cache, dict) else {}
    cache[name] = {"stamp": stamp, "sha256": digest, "max": top}
    try:  # a read-only folder: scanned again next time
        tmp = d / f"{_CACHE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(cache, sort_keys=True), encoding="utf-8")
        os.replace(tmp, d / _CACHE)
    except OSError:
        pass
    return digest, top


def open_tokens(data_dir: str | os.PathLike[str] | None) -> TokenFiles:
    """The token folder ``data_dir`` checked and opened (module docstring).

    Raises:
        ValueError: every problem named in the module docstring, in one line.
    """
    if data_dir is None:
        raise ValueError("tokens: pass the folder of train.bin / val.bin with --data-dir DIR")
    d = Path(data_dir)
    if not d.is_dir():
        raise ValueError(f"tokens: {d} is not a folder")
    meta = _meta(d)
    vocab = _check_int(meta, "vocab_size", None, d)
    context = _check_int(meta, "context", CONTEXT, d)
    name = meta.get("dtype", "uint16" if vocab <= 1 << 16 else "uint32")
    if name not in _DTYPES:
        raise ValueError(f"tokens: dtype {name!r} in {d}'s meta file; use uint16 or uint32")
    dtype = _DTYPES[name]
    if vocab > 1 << (8 * dtype.itemsize):
        raise ValueError(f"tokens: a vocabulary of {vocab:,} ids does not fit {name}; use uint32")
    splits: dict[str, np.ndarray] = {}
    h = hashlib.sha256(json.dumps({"vocab_size": vocab, "dtype": name}).encode())
    for split in ("train", "val", "test"):
        path = d / f"{split}.bin"
        if not path.is_file():
            if split == "test":
                continue
            raise ValueError(f"tokens: {path} is missing")
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ValueError(
                f"tokens: {path} has {size:,} bytes, not a whole number of {name} ids "
                "(is it another dtype?)"
            )
        if size // dtype.itemsize < context + 1:
            raise ValueError(f"tokens: {path} is shorter than one window of {context} ids")
        ids = np.memmap(path, dtype=dtype, mode="r")
        digest, top = _scanned(d, path.name, ids)
        if top >= vocab:
            raise ValueError(
                f"tokens: {path} holds id {top:,}, not below the vocabulary's {vocab:,} "
                "(meta file): a model of that vocabulary has no embedding for it"
            )
        h.update(f"|{split}:{digest}".encode())
        splits[split] = ids
    return TokenFiles(d, vocab, dtype, context, splits["train"], splits["val"],
                      splits.get("test"), h.hexdigest())  # fmt: skip


def dataset_parts(data_dir: str | os.PathLike[str] | None) -> tuple[Any, ...]:
    """``(x_train, y_train, x_val, y_val, x_test, y_test, vocab_size, preprocessing)`` of a
    token folder, for :func:`jaxstale.data.load` (lazy training windows; the evaluation
    windows as int32 arrays)."""
    f = open_tokens(data_dir)
    t = f.context
    val, test, test_from = f.val, f.test, "test.bin"
    if test is None:  # nanoGPT writes no test split: halve the validation file
        half = len(val) // 2
        if half < t + 1:
            raise ValueError(f"tokens: {f.directory / 'val.bin'} is too short to halve")
        val, test, test_from = val[:half], val[half:], "val.bin, second half"
    x_va, y_va = Windows(val, t), Windows(val, t, 1)
    x_te, y_te = Windows(test, t), Windows(test, t, 1)
    pv, pt = spaced(len(x_va), EVAL_WINDOWS), spaced(len(x_te), TEST_WINDOWS)
    pre: dict[str, Any] = {"context": t, "eval_windows": EVAL_WINDOWS, "standardize": "none"}
    pre["test_windows"] = "all" if len(pt) == len(x_te) else len(pt)
    pre |= {"test_from": test_from, "vocab_size": f.vocab_size, "dtype": str(f.dtype.name)}
    pre |= {"num_train": len(Windows(f.train, t)), "num_validation": len(pv)}
    pre["num_test"] = len(pt)
    pre["digest"] = hashlib.sha256(
        (f.digest + json.dumps(pre, sort_keys=True)).encode()
    ).hexdigest()
    return (Windows(f.train, t), Windows(f.train, t, 1), x_va[pv], y_va[pv], x_te[pt],
            y_te[pt], f.vocab_size, pre)  # fmt: skip


def write(
    directory: str | os.PathLike[str],
    *,
    train: Any,
    val: Any,
    test: Any = None,
    vocab_size: int,
    context: int | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Writes flat id arrays as a token folder (``train.bin``, ``val.bin``, optional
    ``test.bin``, ``meta.json``; uint16 where the vocabulary fits, else uint32); returns it.

    Raises:
        ValueError: an id outside ``[0, vocab_size)``.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    name = "uint16" if vocab_size <= 1 << 16 else "uint32"
    for split, ids in (("train", train), ("val", val), ("test", test)):
        if ids is None:
            continue
        a = np.asarray(ids)
        if a.size and (a.min() < 0 or a.max() >= vocab_size):
            raise ValueError(f"tokens.write: {split} ids must be in [0, {vocab_size})")
        a.astype(_DTYPES[name]).tofile(d / f"{split}.bin")
    info = {**(meta or {}), "vocab_size": vocab_size, "dtype": name}
    if context is not None:
        info["context"] = context
    (d / "meta.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", "utf-8")
    return d


def write_text(directory: str | os.PathLike[str], name: str = "shakespeare") -> Path:
    """The embedded text corpus ``name`` (:func:`jaxstale.text.load_text`) as a token folder:
    its character ids, its three splits, its vocabulary in ``meta.json`` (``"itos"``)."""
    from jaxstale.text import load_text

    t = load_text(name)
    return write(directory, train=t.train, val=t.val, test=t.test, vocab_size=t.vocab_size,
                 meta={"itos": t.vocabulary, "source": name})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxstale.tokens DIR``: the embedded Shakespeare written as a token folder."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m jaxstale.tokens DIR", file=sys.stderr)
        return 2
    print(write_text(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
