"""The delay-overhead benchmark on its quick setting: what holds exactly is the bytes of the
stored versions (τ + 1 copies of the weights, one more with prediction), not the timings."""

import pytest

from benchmarks import delay_overhead
from jaxstale import models


@pytest.mark.slow  # 30 s: three GPT steps compiled and timed
def test_quick_rows_store_the_versions_they_need(tmp_path):
    out = delay_overhead.main(["--quick", "--out", str(tmp_path)])
    rows = {r["variant"]: r for r in out["rows"]}
    assert set(rows) == {"sync", "τ=2 stale", "τ=2 predicted"} and rows["sync"]["ratio"] == 1
    n = models.param_count(models.create("gpt-tiny", input_shape=(64,), num_classes=83))
    mib = 4 * n / 2**20
    assert rows["τ=2 stale"]["stored_mib"] == pytest.approx(3 * mib)
    assert rows["τ=2 predicted"]["stored_mib"] == pytest.approx(4 * mib)
    assert all(r["step_ms"] > 0 for r in rows.values())
    assert not (tmp_path / "delay_overhead.md").exists()  # --quick writes no result
