"""The GPT throughput benchmark (issue 23) on its quick setting: what holds exactly is the
parameter counts (the model's, by formula) and XLA's flop count of a training step, at least
the 6·N per token of a dense model's forward and backward over its matrices."""

import pytest

from benchmarks import gpt_throughput
from jaxstale import flops, models


@pytest.mark.slow  # 30 s: two GPT steps compiled and timed
def test_quick_rows_count_parameters_and_flops(tmp_path):
    out = gpt_throughput.main(["--quick", "--out", str(tmp_path)])
    rows = {r["preset"]: r for r in out["rows"]}
    assert set(rows) == {"tiny", "cpu", "deep", "gpu"} and "tokens_per_s" not in rows["gpu"]
    for p in ("tiny", "cpu", "deep"):
        model = models.create(f"gpt-{p}", input_shape=(64,), num_classes=83)
        assert rows[p]["params"] == models.param_count(model)
        assert rows[p]["tokens_per_s"] > 0 and rows[p]["flops_per_token"] > 6 * rows[p]["params"]
        want = flops.gpt_flops_per_token(**{k: rows[p][k] for k in ("layers", "width", "heads")},
                                         context=64, vocab=83)  # fmt: skip
        assert rows[p]["model_flops_per_token"] == want and rows[p]["mfu"] is None  # a CPU
        assert rows[p]["achieved_gflops"] == pytest.approx(
            rows[p]["tokens_per_s"] * want / 1e9, rel=1e-3)  # fmt: skip
    assert rows["gpu"]["params"] == 85_232_723 and out["ratio"] > 1
    assert "| MFU |" in out["table"] and "– (peak unknown)" in out["table"]
    assert not (tmp_path / "gpt_throughput.md").exists()  # --quick writes no result
