"""pipeline_staleness on a language model: a GPT on the embedded Shakespeare, measured and
selected by its validation loss (lower is better), and the model/data mismatches refused."""

import json
import math

import pytest
from flax import nnx

from experiments import pipeline_staleness as exp
from experiments.config import from_argv
from jaxstale import models

LM = ["--dataset", "shakespeare", "--model", "gpt-tiny", "--stages", "2", "--seeds", "2"]
LM += ["--steps", "24", "--eval-every", "12", "--batch-size", "8", "--optimizer", "adamw"]
LM += ["--lrs", "0.0003,0.01", "--methods", "sync,vanilla", "--extend-edges", "0"]


@pytest.mark.slow  # 30 s: two policies, two compiles of the GPT's pipeline round
def test_a_gpt_on_shakespeare_end_to_end(tmp_path):
    out = tmp_path / "run"
    res = exp.main([*LM, "--out", str(out)])
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert len(rows) == 8
    for r in rows:
        assert "final_val_accuracy" not in r and "final_test_accuracy" not in r
        assert r["diverged"] is False and r["final_val_loss"] < math.log(83)
        assert r["final_test_loss"] > 0 and r["updates_to_target"] is None  # 2 nats: far off
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"val_loss", "test_loss"} <= set(rec) and "test_correct" not in rec
    # the rate with the lower mean validation loss is selected, per policy
    for method in ("sync", "vanilla"):
        mean = lambda lr, m=method: sum(
            r["final_val_loss"] for r in rows if (r["method"], r["lr"]) == (m, lr)
        )
        best = min((0.0003, 0.01), key=mean)
        assert res["selected"][("gpt-tiny", method, 2)] == best
    table = res["table"]
    assert "Test loss (nats/token) at each policy's learning rate" in table
    assert "Updates until validation loss ≤ 2 " in table and "next character" in table
    assert "Paired test-loss difference to vanilla (nats;" in table
    for name in ("plot.png", "loss_vs_stages.png"):  # a loss under its own name
        assert (out / name).exists()
    assert not (out / "accuracy_vs_stages.png").exists()


@pytest.mark.slow  # ~40 s: the GPT's round compiled for both executors
def test_the_mesh_runs_a_gpt_with_adamw_and_asyncpp_momentum_as_the_emulator_does(tmp_path):
    """NAdamW (decay on matrices) with AsyncPP's β1 per stage: the mesh executor updates each
    stage's pytree (``stage_trees``) and agrees with the emulator to Adam's float32 spread."""
    argv = [*LM[:6], "--seeds", "1", "--steps", "12", "--eval-every", "6", "--batch-size", "8"]
    argv += ["--optimizer", "nadamw", "--momentum-rule", "asyncpp", "--lrs", "0.003"]
    argv += ["--methods", "stash", "--extend-edges", "0"]
    got = {}
    for kind in ("emulate", "mesh"):
        res = exp.main([*argv, "--executor", kind, "--out", str(tmp_path / kind)])
        (row,) = res["rows"]
        got[kind] = row
    assert not got["mesh"]["diverged"]
    for key in ("final_train_loss", "final_val_loss", "final_test_loss"):
        assert got["mesh"][key] == pytest.approx(got["emulate"][key], abs=2e-3)


def test_remat_is_recorded_only_where_it_is_set():
    """Runs before --remat keep their fingerprint; a set one is in the config."""
    plain = from_argv(exp.Config, LM)[0].resolved()
    lean = from_argv(exp.Config, [*LM, "--remat", "names"])[0].resolved()
    assert "remat" not in plain and lean.pop("remat") == "names"
    assert lean == plain


@pytest.mark.slow  # ~110 s: the GPT's stash round compiled three times
def test_remat_keeps_stashings_numbers_on_both_executors(tmp_path):
    """Stash's backward reads the weights its forward read, so what a slot keeps changes only
    the rounding of what is recomputed: remat='names' on the emulator and on the mesh agrees
    with jax.vjp's own residuals, and its rows say which remat ran."""
    argv = [*LM[:6], "--seeds", "1", "--steps", "12", "--eval-every", "6", "--batch-size", "8"]
    argv += ["--lrs", "0.003", "--methods", "stash", "--extend-edges", "0"]
    got = {}
    for kind, remat in (("emulate", "none"), ("emulate", "names"), ("mesh", "names")):
        out = tmp_path / f"{kind}-{remat}"
        (row,) = exp.main([*argv, "--executor", kind, "--remat", remat, "--out", str(out)])["rows"]
        assert row.get("remat", "none") == remat
        got[kind, remat] = row
    ref = got["emulate", "none"]
    for row in (got["emulate", "names"], got["mesh", "names"]):
        for key in ("final_train_loss", "final_val_loss", "final_test_loss"):
            assert row[key] == pytest.approx(ref[key], abs=2e-4)


@pytest.mark.slow  # 13 s, the GPT round's compile; the refusals below stay in make test
def test_one_policy_of_a_gpt_selects_its_rate_on_validation_loss(tmp_path):
    argv = [*LM, "--methods", "sync", "--seeds", "1", "--steps", "8", "--eval-every", "8"]
    argv += ["--stages", "1", "--lrs", "0.003,0.01"]  # one stage: no gradient into the tokens
    res = exp.main([*argv, "--out", str(tmp_path / "run")])
    rows = res["rows"]
    assert {r["lr"] for r in rows} == {0.003, 0.01} and all("final_val_loss" in r for r in rows)
    best = min(rows, key=lambda r: r["final_val_loss"])["lr"]
    assert res["selected"] == {("gpt-tiny", "sync", 1): best}
    assert "Test loss (nats/token)" in res["table"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "mlp"], "input_shape must be (H, W, C) or (L, C)"),
        (["--stages", "4"], "'gpt-tiny' has 2 blocks, fewer than N=4"),
        (["--dataset", "digits"], "gpt-tiny takes [B, T] token ids"),
        (
            ["--dataset", "digits", "--model", "mlp", "--target", "2"],
            "an accuracy must be in (0, 1]",
        ),
        (["--standardize", "channel"], "a text's inputs are token ids"),
        (["--model", "gpt-tiny,mlp", "--remat", "names"], "mlp tags none (dots or full"),
        (["--remat", "some"], "remat"),
    ],
)
def test_model_and_data_mismatches_are_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        exp.main([*LM, *argv, "--out", str(out)])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("name", ["async_bn"])  # the others take a text (their own tests)
def test_experiments_without_language_models_refuse_a_text_dataset(name, tmp_path, capsys):
    import importlib

    mod = importlib.import_module(f"experiments.{name}")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        mod.main(["--dataset", "shakespeare", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'shakespeare' is a language model task" in err and "delay_cliff" in err
    assert not out.exists()


class _Bigram(nnx.Module):
    """Next-token logits from an embedding table alone: no 2-D weight Muon would take."""

    def __init__(self, vocab):
        self.tokens = nnx.Embed(vocab, vocab, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.tokens(x)


def _register_gpt(name, *, context=None, vocab=None, bigram=False):
    def build(*, input_shape, num_classes, seed):
        if bigram:
            return models.StagedModel(
                [_Bigram(num_classes), nnx.LayerNorm(num_classes, rngs=nnx.Rngs(0))]
            )
        ctx, v = context or input_shape[0], vocab or num_classes
        return models.gpt(ctx, v, layers=2, width=16, heads=2, seed=seed)

    models.register_model(name, build, overwrite=True)


@pytest.mark.parametrize(
    "kw, argv, message",
    [
        ({"context": 32}, [], "sequences of 64 ids are longer than the context of 32"),
        ({"vocab": 50}, [], "the data has a vocabulary of 83: (2, 64, 83) needed"),
        ({"bigram": True}, ["--optimizer", "muon"], "muon orthogonalises 2-D weights"),
    ],
)
def test_a_registered_gpt_that_does_not_fit_is_one_line(tmp_path, capsys, kw, argv, message):
    _register_gpt("user-gpt", **kw)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        exp.main([*LM, "--model", "user-gpt", *argv, "--out", str(out)])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_registered_gpt_is_checked_as_a_language_model():
    _register_gpt("user-gpt")
    config, _ = from_argv(exp.Config, [*LM, "--model", "user-gpt", "--optimizer", "muon"])
    cfg, ds = exp._prepare(config)
    assert cfg["models"] == ["user-gpt"] and ds.task == "language_model"


def test_tiny_shakespeare_from_tfds_is_a_pipeline_dataset(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    text = "".join(chr(32 + i % 90) for i in range(2000))  # every character, in order

    def source(self, split, **kw):
        return [{"text": text}]

    argv = [*LM, "--dataset", "tiny_shakespeare", "--data-dir", str(tmp_path)]
    with tfds.testing.mock_data(as_data_source_fn=source):
        cfg, ds = exp._prepare(from_argv(exp.Config, argv)[0])
    assert ds.task == "language_model" and ds.num_classes == 90 and cfg["target"] == 2.0


def test_a_text_smoke_run_is_sized_for_a_minute():
    text = exp.Config(quick=True, dataset="shakespeare", model=("gpt-tiny",)).resolved()
    assert (text["stages"], text["methods"], text["steps"]) == (
        [2],
        ["sync", "vanilla"],
        60,
    )
    images = exp.Config(quick=True).resolved()
    assert images["stages"] == [2, 4] and images["steps"] == 300 and len(images["methods"]) == 6


def test_a_gpt_defaults_to_adamw_at_its_peak_rates():
    """A text run defaulted to SGD, whose 60-update smoke run ended at the unigram level
    (gpt-tiny: 3.24 nats at AdamW's 1e-3 too; 2.85 at 0.01): it cannot tell a GPT that learns
    from one that counts characters (issue 51). Images keep SGD."""
    lm = exp.Config(quick=True, dataset="shakespeare", model=("gpt-tiny",)).resolved()
    assert lm["optimizer"] == "adamw" and lm["lrs"] == [0.003, 0.01]
    assert exp.Config(quick=True).resolved()["optimizer"] == "sgd"
    assert exp.Config(dataset="shakespeare", optimizer="sgd").resolved()["optimizer"] == "sgd"
