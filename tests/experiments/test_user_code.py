"""A run folder is refused, in one line, when user code or data it was computed with changed
(issue 21): the "Prototype your own method" tutorial's example (docs/tutorials/your-method.md)
with ``c`` edited, a registered model's helper, a registered dataset loader; comments and
docstrings change nothing."""

import re

import numpy as np
import pytest
from flax import nnx

from experiments import async_workers
from jaxstale import data, models

README_BLOCK = next(
    b
    for b in re.findall(
        r"```python\n(.*?)```", open("docs/tutorials/your-method.md", encoding="utf-8").read(), re.S
    )
    if "staleness_damping" in b
)
TINY = ["--steps", "6", "--seeds", "1", "--workers", "2", "--lrs", "0.01", "--batch-size", "16"]


def _register_readme_method(c: str) -> None:
    code = README_BLOCK.split("argv = ")[0].replace("c=0.5", f"c={c}")
    exec(compile(code, "your-method.md[prototype]", "exec"), {"__name__": "readme"})


def _refused(argv, capsys):
    capsys.readouterr()  # what the earlier runs printed
    with pytest.raises(SystemExit) as e:
        async_workers.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow  # 5 s; the registered model / dataset / policy edits stay in make test
def test_editing_the_readme_prototype_refuses_its_old_results(tmp_path, capsys):
    argv = [*TINY, "--methods", "damped-asgd", "--out", str(tmp_path / "run")]
    _register_readme_method("0.5")
    first = async_workers.main(argv)["rows"]
    _register_readme_method("0.5")  # the same code registered again: resumed, same numbers
    assert async_workers.main(argv)["rows"] == first
    _register_readme_method("0.9")
    err = _refused(argv, capsys)
    assert "user sources" in err and "--force-resume" in err


class _Net(nnx.Module):
    def __init__(self, din, width, classes, seed):
        rngs = nnx.Rngs(seed)
        self.a = nnx.Linear(din, width, rngs=rngs)
        self.b = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, x):
        return self.b(nnx.relu(self.a(x.reshape(x.shape[0], -1))))


WIDTH = 16


def _build(*, input_shape, num_classes, seed):
    return _Net(int(np.prod(input_shape)), WIDTH, num_classes, seed)


@pytest.mark.slow  # make test ≤ 8 min with a margin: CI runs it in make test-slow
def test_editing_a_registered_model_refuses_its_old_results(tmp_path, capsys, monkeypatch):
    models.register_model("fp-net", _build, overwrite=True)
    argv = [*TINY, "--methods", "asgd", "--model", "fp-net", "--out", str(tmp_path / "run")]
    async_workers.main(argv)
    monkeypatch.setitem(_build.__globals__, "WIDTH", 8)  # a value the builder reads
    assert "user sources" in _refused(argv, capsys)


def test_editing_a_registered_dataset_refuses_its_old_results(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 2, 3, 1)).astype(np.float32), rng.integers(0, 3, 96)

    def loader(data_dir, shift=0.0):
        return x + shift, y, x[:24] + shift, y[:24], 3

    data.register_dataset("fp-blobs", loader, overwrite=True)
    argv = [*TINY, "--methods", "asgd", "--dataset", "fp-blobs", "--out", str(tmp_path / "run")]
    async_workers.main(argv)

    def loader(data_dir, shift=1.0):
        return x + shift, y, x[:24] + shift, y[:24], 3

    data.register_dataset("fp-blobs", loader, overwrite=True)
    err = _refused(argv, capsys)
    assert "user sources" in err and "dataset content" in err
