"""Model FLOPs per token and MFU (:mod:`jaxstale.flops`) and the LM rows' throughput fields
(``experiments/throughput.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxstale import data, flops, models
from jaxstale.models.gpt import PRESETS, gpt_param_count


@pytest.mark.parametrize("preset", ["tiny", "cpu", "gpu"])
def test_six_n_is_six_times_the_multiplied_weights(preset):
    """6N counts every weight but the token and position tables (lookups, not products)."""
    kw = PRESETS[preset]
    t, v = 64, 83
    n = gpt_param_count(t, v, layers=kw["layers"], width=kw["width"]) - (v + t) * kw["width"]
    attn = 12 * kw["layers"] * kw["heads"] * (kw["width"] // kw["heads"]) * t
    got = flops.gpt_flops_per_token(context=t, vocab=v, **kw)
    assert got == 6 * n + attn
    model = models.create(f"gpt-{preset}", input_shape=(t,), num_classes=v)
    assert models.param_count(model) - (v + t) * kw["width"] == n


def test_peaks_are_found_by_device_kind_and_unknown_elsewhere():
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert flops.peak_flops("NVIDIA H200", "tf32") == 494e12
    assert flops.peak_flops("NVIDIA A100-SXM4-40GB", "float32") == 19.5e12
    assert flops.peak_flops("cpu", "float32") is None
    assert flops.peak_flops("TPU v5e", "float32") is None  # a precision it has no peak for
    assert flops.mfu(1000.0, 1e9, "NVIDIA H100", "bfloat16") == pytest.approx(1e12 / 989e12)


def test_a_language_model_row_carries_its_throughput(capsys):
    from experiments.throughput import lm_throughput, log_throughput

    ds = data.load("shakespeare")
    got = lm_throughput("gpt-cpu", ds, steps=100, batch=16, wall=2.0)
    assert got["tokens_per_s"] == 100 * 16 * 64 / 2.0
    assert got["flops_per_token"] == flops.gpt_flops_per_token(context=64, vocab=83,
                                                               **PRESETS["cpu"])  # fmt: skip
    assert got["mfu"] is None  # a CPU: no known peak
    assert lm_throughput("mine", ds, 100, 16, 2.0)["flops_per_token"] is None
    log_throughput("demo", "gpt-cpu N=8 stash", 6, got)
    assert "[demo] gpt-cpu N=8 stash: 51,200 tokens/s over its 6 runs, MFU unknown" in (
        capsys.readouterr().err
    )
    digits = data.load("digits")
    assert lm_throughput("mlp", digits, 100, 16, 2.0) == {}
    # gpt2-small: its head is 50,304 wide whatever the data; the attention term uses the windows
    big = lm_throughput("gpt2-small", ds, 1, 1, 1.0)["flops_per_token"]
    assert big == flops.gpt_flops_per_token(layers=12, width=768, heads=12, context=64,
                                            vocab=50304)  # fmt: skip
    assert np.isclose(big / 6, 123_739_776 + 12 * 12 * 768 * 64 / 6)


def test_throughput_is_timing_not_a_result():
    from experiments.runs.groups import TIMING_FIELDS

    assert {"tokens_per_s", "mfu", "wall_s", "cpu_s"} <= set(TIMING_FIELDS)
