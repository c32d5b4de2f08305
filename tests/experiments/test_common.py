"""experiments/common.py's checks, through every experiment's command line (issue 21): repeats
in a list, flags that would be ignored, unknown or ill-fitting models, sizes that cannot fit in
memory — each one line on stderr, exit status 2, no traceback, nothing written; and the one data
path, which honours --standardize and --data-dir in every experiment."""

import importlib

import numpy as np
import pytest
from flax import nnx

from jaxstale import data, models

EXPERIMENTS = ("async_workers", "delay_cliff", "pipeline_staleness", "sync_baseline", "async_bn")

#: a language model on the embedded text
_GPT = ["--model", "gpt-tiny", "--dataset", "shakespeare", "--inner-steps", "10"]

BAD = [
    # a repeated value runs the same cell twice and counts it as two seeds
    ("async_workers", ["--lrs", "0.01,0.01"], "--lrs", "given twice"),
    ("async_workers", ["--workers", "4,4"], "--workers", "given twice"),
    ("async_workers", ["--methods", "asgd,asgd"], "--methods", "given twice"),
    ("async_workers", ["--momentum", "0.9,0.9"], "--momentum", "given twice"),
    ("async_workers", ["--model", "mlp,mlp"], "--model", "given twice"),
    ("async_workers", ["--model", "mlp", "mlp"], "--model", "given twice"),
    ("delay_cliff", ["--delays", "0,2,2"], "--delays", "given twice"),
    ("pipeline_staleness", ["--stages", "2,2"], "--stages", "given twice"),
    ("pipeline_staleness", ["--methods", "sync,sync"], "--methods", "given twice"),
    ("sync_baseline", ["--lrs", "0.1,0.1"], "--lrs", "given twice"),
    ("async_bn", ["--workers", "1,1"], "--workers", "given twice"),
    # a delay no shorter than the run: no gradient would arrive (tabled as a result before)
    ("constant_delay", ["--delays", "0,50", "--steps", "10"], "--delays", "not shorter than"),
    ("constant_delay", ["--stage-profiles", "16", "--steps", "8"], "--stage-profiles", "not sh"),
    # flags that would be ignored in this configuration
    ("async_workers", ["--model", "mlp", "cnn"], "--model", "takes one model"),
    ("async_workers", ["--delay", "constant", "--straggler-fraction", "0.5"], "--straggler-f", ""),
    ("async_workers", ["--delay", "round_robin", "--straggler-slowdown", "3"], "--straggler-s", ""),
    ("async_workers", ["--methods", "asgd", "--lc-lambdas", "0.1"], "--lc-lambdas", "lc-asgd"),
    ("async_workers", ["--out", ""], "--out", "empty string"),
    ("delay_cliff", ["--model", "mlp", "cnn"], "--model", "takes one model"),
    # unknown names and methods that cannot run here
    ("async_workers", ["--model", "foo"], "--model", "unknown model 'foo'"),
    ("delay_cliff", ["--model", "foo"], "--model", "unknown model 'foo'"),
    ("delay_cliff", ["--methods", "ssgd"], "--methods", "synchronous"),
    ("pipeline_staleness", ["--model", "foo"], "--model", "unknown model 'foo'"),
    ("sync_baseline", ["--model", "foo"], "--model", "unknown model 'foo'"),
    ("async_bn", ["--model", "foo"], "--model", "unknown model 'foo'"),
    # sizes that cannot fit in memory, named by the flag that drives them
    ("async_workers", ["--steps", str(10**12)], "--steps", "of memory"),
    ("async_workers", ["--workers", str(10**6)], "--workers", "of memory"),
    ("delay_cliff", ["--delays", f"0,{10**8}"], "--delays", "of memory"),
    ("pipeline_staleness", ["--steps", str(10**11)], "--steps", "of memory"),
    ("sync_baseline", ["--steps", str(10**11)], "--steps", "of memory"),
    ("async_bn", ["--workers", str(10**8)], "--workers", "of memory"),
    ("local_sgd", ["--steps", str(10**11)], "--steps", "of memory"),
    # every worker's inner state and weights, per lane (the streams alone fit)
    ("local_sgd", [*_GPT, "--workers", "30000", "--steps", "10"], "--workers", "of memory"),
]


def _main(experiment):
    return importlib.import_module(f"experiments.{experiment}").main


@pytest.mark.parametrize(("experiment", "argv", "flag", "words"), BAD)
def test_bad_flag_is_one_line_exit_2_and_nothing_written(
    experiment, argv, flag, words, tmp_path, capsys
):
    out = tmp_path / "run"
    extra = [] if "--out" in argv else ["--out", str(out)]
    with pytest.raises(SystemExit) as e:
        _main(experiment)([*argv, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err  # one line: no usage block, no traceback
    assert f": error: argument {flag}" in err[-1] and words in err[-1], err[-1]
    assert not out.exists()


class _Wide(nnx.Module):  # one logit too many for the dataset's classes
    def __init__(self, din, classes, seed):
        self.lin = nnx.Linear(din, classes + 1, rngs=nnx.Rngs(seed))

    def __call__(self, x):
        return self.lin(x.reshape(x.shape[0], -1))


def _wide(*, input_shape, num_classes, seed):
    return _Wide(int(np.prod(input_shape)), num_classes, seed)


@pytest.mark.parametrize("experiment", ["async_workers", "delay_cliff", "sync_baseline"])
def test_a_model_with_the_wrong_number_of_logits_is_refused(experiment, tmp_path, capsys):
    models.register_model("too-wide", _wide, overwrite=True)
    with pytest.raises(SystemExit) as e:
        _main(experiment)(["--model", "too-wide", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "logits of shape (2, 11)" in err and "(2, 10)" in err, err
    assert not (tmp_path / "run").exists()


def test_a_pipeline_needs_a_staged_model(tmp_path, capsys):
    models.register_model("not-staged", lambda **kw: _Wide(64, 9, 0), overwrite=True)
    with pytest.raises(SystemExit) as e:
        _main("pipeline_staleness")(["--model", "not-staged", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "StagedModel" in err, err


def test_nan_features_of_a_registered_dataset_are_refused(tmp_path, capsys):
    x = np.ones((40, 2, 2, 1), np.float32)
    x[3, 0, 0, 0] = np.nan
    y = np.arange(40) % 2
    data.register_dataset("nan-blobs", lambda d: (x, y, x[:8], y[:8], 2), overwrite=True)
    with pytest.raises(SystemExit) as e:
        _main("async_workers")(["--dataset", "nan-blobs", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "finite" in err and "x_train" in err, err


class _Stop(Exception):
    pass


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_loads_data_as_its_flags_say(experiment, monkeypatch, tmp_path):
    """--standardize and --data-dir reach data.load in every experiment (four ignored them)."""
    seen = {}

    def load(name, **kwargs):
        seen.update(kwargs, name=name)
        raise _Stop

    monkeypatch.setattr(data, "load", load)
    argv = ["--standardize", "none", "--data-dir", str(tmp_path / "tfds")]
    with pytest.raises(_Stop):
        _main(experiment)([*argv, "--out", str(tmp_path / "run")])
    assert seen["standardize"] == "none" and seen["data_dir"] == str(tmp_path / "tfds")
