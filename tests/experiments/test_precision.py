"""experiments.precision: ``--precision bf16`` trains a GPT in mixed precision in a run folder
of its own, near the float32 run's numbers; an experiment or a model without a bf16 path
refuses it in one line, before anything is written."""

import json

import pytest

from experiments import async_bn, constant_delay, sync_baseline

GPT = ["--dataset", "shakespeare", "--model", "gpt-tiny", "--steps", "6", "--eval-every", "3"]
GPT += ["--seeds", "1", "--lrs", "0.003", "--delays", "0,1", "--methods", "stale"]
GPT += ["--extend-edges", "0"]


@pytest.mark.slow  # 30 s: two GPT sweeps
def test_bf16_runs_the_gpt_in_its_own_folder_near_float32(tmp_path):
    f32 = constant_delay.main([*GPT, "--out", str(tmp_path / "f32")])
    b16 = constant_delay.main([*GPT, "--precision", "bf16", "--out", str(tmp_path / "b16")])
    cfg = json.loads((tmp_path / "b16" / "config.json").read_text())["config"]
    assert cfg["precision"] == "bf16"
    assert "precision" not in json.loads((tmp_path / "f32" / "config.json").read_text())["config"]
    by = lambda res: {(r["delay"]): r["final_val_loss"] for r in res["rows"]}
    a, b = by(f32), by(b16)
    assert a.keys() == b.keys()
    for k in a:  # bfloat16 products: the same run to about a hundredth of a nat
        assert a[k] != b[k] and abs(a[k] - b[k]) < 0.05, (k, a[k], b[k])


@pytest.mark.parametrize(
    ("main", "argv", "words"),
    [
        (
            constant_delay.main,
            ["--dataset", "digits", "--model", "mlp", "--precision", "bf16"],
            "mlp computes in float32",
        ),
        (sync_baseline.main, ["--precision", "bf16"], "mlp, cnn compute in float32"),
        (async_bn.main, ["--precision", "bf16"], "async_bn computes in float32 only"),
    ],
)
def test_bf16_without_a_bf16_path_is_one_line(tmp_path, capsys, main, argv, words):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--precision" in err[-1] and words in err[-1]
    assert not (tmp_path / "x").exists()
