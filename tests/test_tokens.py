"""Token folders on disk (:mod:`jaxstale.tokens`, nanoGPT's format): the embedded Shakespeare
written by the tool loads equal to the built-in text, windows are read lazily, every bad input
is one line, and an experiment on the folder computes what it computes on the built-in text."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from jaxstale import data, tokens


@pytest.fixture(scope="module")
def shakespeare_folder(tmp_path_factory):
    return tokens.write_text(tmp_path_factory.mktemp("tok") / "shakespeare")


def test_the_tool_writes_shakespeare_that_loads_equal_to_the_builtin(shakespeare_folder):
    a, b = data.load("shakespeare"), data.load("tokens", data_dir=str(shakespeare_folder))
    for field in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        np.testing.assert_array_equal(np.asarray(getattr(b, field)), getattr(a, field))
    assert (b.num_classes, b.task) == (a.num_classes, a.task) == (83, "language_model")
    assert isinstance(b.x_train, tokens.Windows)  # the training split stays on disk
    assert b.preprocessing["test_windows"] == "all" and b.preprocessing["test_from"] == "test.bin"
    meta = json.loads((shakespeare_folder / "meta.json").read_text())
    assert meta["vocab_size"] == 83 and meta["dtype"] == "uint16" and len(meta["itos"]) == 83


def test_windows_read_only_what_they_index_and_match_the_flat_ids(tmp_path):
    ids = np.random.default_rng(0).integers(0, 300, 10_001)
    d = tokens.write(tmp_path, train=ids, val=ids[:2000], vocab_size=300, context=10)
    ds = data.load("tokens", data_dir=str(d))
    assert ds.x_train.shape == (1000, 10)
    pick = np.array([[3, 999], [0, 3]])
    np.testing.assert_array_equal(ds.x_train[pick], ids[:10_000].reshape(1000, 10)[pick])
    np.testing.assert_array_equal(ds.y_train[pick], ids[1:].reshape(1000, 10)[pick])
    # an Indexed stream over it holds the rows the run uses, renumbered: same batches
    idx = data.batch_indices(len(ds.x_train), batch_size=4, num_steps=5, seed=0)
    lazy = data.indexed(ds.x_train, idx)
    assert len(lazy.x) == len(np.unique(idx)) <= 20
    np.testing.assert_array_equal(lazy.gathered(), np.asarray(ds.x_train)[idx])
    with pytest.raises(IndexError, match="outside"):
        ds.x_train[np.array([1000])]
    # nanoGPT writes no test split: validation's first half validates, its second half tests
    assert ds.preprocessing["test_from"] == "val.bin, second half"
    np.testing.assert_array_equal(ds.x_test[0], ids[1000:1010])


def test_a_large_vocabulary_is_uint32_and_a_pickled_meta_is_read(tmp_path):
    ids = np.arange(3000) * 31 % 70_000
    d = tokens.write(tmp_path / "big", train=ids, val=ids, vocab_size=70_000)
    assert json.loads((d / "meta.json").read_text())["dtype"] == "uint32"
    assert data.load("tokens", data_dir=str(d)).num_classes == 70_000
    p = tokens.write(tmp_path / "pkl", train=ids % 50, val=ids % 50, vocab_size=50)
    (p / "meta.json").unlink()
    (p / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 50, "itos": {0: "a"}}))
    assert data.load("tokens", data_dir=str(p)).num_classes == 50


def _folder(tmp_path, **change):
    d = tokens.write(tmp_path / "t", train=np.arange(500) % 40, val=np.arange(300) % 40,
                     vocab_size=40, context=8)  # fmt: skip
    for name, value in change.items():
        if name == "meta":
            (d / "meta.json").write_text(json.dumps(value))
        elif value is None:
            (d / name.replace("_", ".")).unlink()
        else:
            (d / name.replace("_", ".")).write_bytes(value)
    return str(d)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_bin": None}, r"train\.bin is missing"),
        ({"meta_json": None}, "has no meta.json or meta.pkl"),
        ({"meta": {"vocab_size": 0}}, "positive integer 'vocab_size'"),
        ({"meta": {"vocab_size": 40, "dtype": "int8"}}, "dtype 'int8'"),
        ({"meta": {"vocab_size": 70_000, "dtype": "uint16"}}, "does not fit uint16"),
        ({"train_bin": b"\x01\x00\x02"}, "not a whole number of uint16 ids"),
        ({"meta": {"vocab_size": 20, "context": 8}}, r"holds id 39, not below the vocabulary's 20"),
        ({"val_bin": np.arange(5, dtype="<u2").tobytes()}, "shorter than one window"),
    ],
    ids=["missing", "no-meta", "vocab", "dtype", "narrow", "odd-bytes", "ids", "short"],
)
def test_bad_input_is_one_line(tmp_path, change, message):
    with pytest.raises(ValueError, match=message) as e:
        data.load("tokens", data_dir=_folder(tmp_path, **change))
    assert "\n" not in str(e.value)


def test_no_folder_and_a_malicious_pickle_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--data-dir"):
        data.load("tokens")
    d = _folder(tmp_path, meta_json=None)
    (tmp_path / "t" / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 40, "x": np.int64(3)}))
    with pytest.raises(ValueError, match="not a plain dict"):
        data.load("tokens", data_dir=d)


def test_the_digest_is_cached_and_follows_the_content(tmp_path):
    d = _folder(tmp_path)
    first = data.load("tokens", data_dir=d).preprocessing["digest"]
    assert (tmp_path / "t" / ".jaxstale-digest.json").exists()
    assert data.load("tokens", data_dir=d).preprocessing["digest"] == first
    tokens.write(tmp_path / "t", train=np.arange(500) % 39, val=np.arange(300) % 40,
                 vocab_size=40, context=8)  # fmt: skip
    assert data.load("tokens", data_dir=d).preprocessing["digest"] != first


@pytest.mark.slow  # 34 s: the arrays' equality above runs in make test
def test_an_experiment_on_the_folder_computes_what_it_computes_on_the_text(
    tmp_path, shakespeare_folder
):
    from experiments import pipeline_staleness as ps
    from experiments.runs.groups import TIMING_FIELDS

    rows = {}
    for name, kw in (("shakespeare", {}), ("tokens", {"data_dir": str(shakespeare_folder)})):
        out = str(tmp_path / name)
        cfg = ps.Config(quick=True, dataset=name, model=("gpt-tiny",), stages=(2,),
                        methods=("stash",), seeds=2, steps=20, out=out, **kw)  # fmt: skip
        rows[name] = [{k: v for k, v in r.items() if k not in TIMING_FIELDS}
                      for r in ps.run(cfg)]  # fmt: skip
    assert rows["tokens"] == rows["shakespeare"] and len(rows["tokens"]) >= 2
