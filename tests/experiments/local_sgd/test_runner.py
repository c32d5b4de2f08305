"""local_sgd's warm start (issue 52: DiLoCo's runs start from a synchronously trained model):
K steps of the inner optimizer, shared by every run of a (model, seed), cached in the run
folder, its digest in every row; without it the config is as before (and so the rows:
tests/experiments/test_local_sgd.py)."""

import json

import jax
import numpy as np
import optax
import pytest

from experiments import local_sgd as exp
from experiments import starts
from experiments.config import ConfigError
from experiments.local_sgd import runner
from jaxstale import data, losses, models, optimizers

ARGV = ["--dataset", "digits", "--model", "mlp", "--steps", "8", "--inner-steps", "4",
        "--workers", "2", "--seeds", "1", "--extend-edges", "0", "--batch-size", "16",
        "--lrs", "0.7", "--methods", "diloco"]  # fmt: skip


def test_warm_start_is_k_inner_steps_kept_in_the_folder_its_digest_in_the_rows(tmp_path):
    out = tmp_path / "run"
    exp.main([*ARGV, "--warm-start", "3", "--out", str(out)])
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["diloco"]
    with np.load(out / "inputs" / "start-mlp-seed0.npz") as z:
        d = str(z["digest"])
        saved = [z[f"a{i}"] for i in range(len(z.files) - 1)]
    assert {r["start_digest"] for r in rows} == {d}
    # the reference: three steps of the inner optimizer on one worker's batches, by hand
    cfg = exp.Config(dataset="digits", model=("mlp",), steps=8, inner_steps=(4,),
                     workers=(2,), seeds=1, batch_size=16).resolved()  # fmt: skip
    ds = data.load("digits")
    shape = tuple(ds.x_train.shape[1:])
    net = models.create("mlp", input_shape=shape, num_classes=ds.num_classes, seed=0, task=ds.task)
    f = models.functional(net)
    tx = optimizers.per_stage(cfg["optimizer"], cfg["inner_lr"], cfg["momentum"], 3)
    idx = data.batch_indices(len(ds.x_train), batch_size=16, num_steps=3,
                             seed=runner.WARM_SEED + 0)  # fmt: skip
    p, opt = f.params, tx.init(f.params)
    for t in range(3):
        x, y = ds.x_train[idx[t]], ds.y_train[idx[t]]
        g = jax.grad(lambda q: losses.cross_entropy(f.apply(q, f.state, x, True)[0], y))(p)
        upd, opt = tx.update(g, opt, p)
        p = optax.apply_updates(p, upd)
    for a, b, init in zip(saved, jax.tree.leaves(p), jax.tree.leaves(f.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert not np.array_equal(a, np.asarray(init))  # trained, not the initial weights
    assert starts.digest(jax.tree.unflatten(jax.tree.structure(f.params), saved)) == d


def test_without_a_warm_start_the_config_is_unchanged():
    base = exp.Config(quick=True).resolved()
    assert "warm_start" not in base and "warm_lr" not in base  # earlier folders keep their names
    warm = exp.Config(quick=True, warm_start=5).resolved()
    assert warm["warm_start"] == 5 and warm["warm_lr"] == warm["inner_lr"]  # by default
    assert exp.Config(quick=True, warm_start=5, warm_lr=0.01).resolved()["warm_lr"] == 0.01
    with pytest.raises(ConfigError, match="--warm-lr is the warm start's; no --warm-start"):
        exp.Config(quick=True, warm_lr=0.01).resolved()


def test_a_warm_start_that_diverges_is_one_line(tmp_path, capsys):
    argv = [*ARGV, "--steps", "4", "--warm-start", "5", "--warm-lr", "1e9"]
    with pytest.raises(SystemExit):
        exp.main([*argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert "the warm start of mlp, seed 0 diverged at step" in err[-1]
    assert "a lower --warm-lr" in err[-1]
