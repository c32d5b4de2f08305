"""The embedded corpus (``jaxstale._shakespeare``): its digest, vocabulary and splits."""

import hashlib
import json
import lzma

import numpy as np
import pytest

from jaxstale import _shakespeare as shk


def test_the_corpus_is_the_one_its_provenance_describes():
    c = shk.load_corpus()
    info = json.loads((shk.FILES / "shakespeare.json").read_text())
    assert c.info == info and len(info["plays"]) == 37
    text = lzma.decompress((shk.FILES / "shakespeare.txt.xz").read_bytes())
    assert hashlib.sha256(text).hexdigest() == info["sha256"] and len(text) >= 1_000_000
    assert info["vocabulary"] == "".join(sorted(set(text.decode("ascii"))))
    # contiguous 90 / 5 / 5 % splits that together are the corpus, in order
    ids = np.concatenate([c.train, c.val, c.test])
    assert shk.decode(ids, c.vocabulary).encode("ascii") == text
    n = len(ids)
    assert abs(len(c.train) / n - 0.9) < 1e-6 and abs(len(c.val) / n - 0.05) < 1e-6
    assert c.train.dtype == np.uint8 and not c.train.flags.writeable
    # each play's span holds its title's words (the titles stand at the top of each text)
    play = info["plays"][0]
    a, b = play["span"]
    assert play["title"].split()[0].upper() in shk.decode(ids[a : a + 200], c.vocabulary).upper()
    assert b > a


def test_encode_refuses_characters_outside_the_vocabulary():
    with pytest.raises(ValueError, match="outside the vocabulary: \\['c'\\]"):
        shk.encode("abc", "ab")
    with pytest.raises(ValueError, match="outside the vocabulary: \\['\u00e9'\\]"):
        shk.encode("caf\u00e9", "acf?")  # not read as "?"


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    for name in ("shakespeare.json", "shakespeare.txt.xz"):
        (tmp_path / name).write_bytes((shk.FILES / name).read_bytes())
    info = json.loads((tmp_path / "shakespeare.json").read_text())
    (tmp_path / "shakespeare.json").write_text(json.dumps({**info, "sha256": "0" * 64}))
    monkeypatch.setattr(shk, "FILES", tmp_path)
    shk.load_corpus.cache_clear()
    try:
        with pytest.raises(ValueError, match="digest differs"):
            shk.load_corpus()
    finally:
        shk.load_corpus.cache_clear()
