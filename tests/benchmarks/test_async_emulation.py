"""The asynchronous-emulation benchmark (issues 12, 21): what an emulated update reads and writes.

No timing is asserted (timings belong in ``benchmarks/results``); what holds exactly is which ops
run and how many bytes XLA counts: the host loop's emulated step passes the worker's snapshot by
reference (no snapshot is copied out of a stack or written back), so its bytes accessed stay
within the synchronous step's + 2 × the parameter bytes, a bound that the ``[M, ...]`` stack step
(the scan loop's program) exceeds.
"""

import pytest

from benchmarks import async_emulation


def test_category_names_the_snapshot_ops():
    assert async_emulation._category("dynamic-slice_bitcast_fusion.2").startswith("snapshot read")
    assert async_emulation._category("bitcast_dynamic-update-slice_fusion").startswith(
        "snapshot write"
    )
    assert async_emulation._category("ynn_fusion.6").startswith("matmuls")
    assert async_emulation._category("multiply_add_fusion.13").startswith("optimizer update")
    assert async_emulation._category("copy.4").startswith("other")


@pytest.mark.slow  # 3 s; the snapshot ops' names stay in make test
def test_profile_the_emulated_host_step_moves_no_snapshot():
    rows = {
        r[0]: r[1:]
        for r in async_emulation.profile_rows(
            "dc-asgd-a", 4, ("mlp", {"hidden": (512, 512)}, (28, 28, 1), 128), steps=2, rounds=1
        )
    }
    assert not [k for k in rows if k.startswith("snapshot")]  # no dynamic-(update-)slice at all
    matmuls = rows["matmuls and reductions (XNNPACK / dot)"]
    assert float(matmuls[0]) > 0 and float(matmuls[1]) > 0  # both steps were traced
    assert float(rows["total"][1]) > 0


@pytest.mark.slow  # 7 s of compiles; the benchmark's row test above stays in make test
def test_emulated_step_bytes_within_sync_plus_two_params():
    f, x, y = async_emulation._model("mlp", {"hidden": (64, 32)}, (8, 8, 1), 16)
    for method in async_emulation.METHODS:
        stack = method == "asgd"  # one method shows the bound can fail (each compile ~0.5 s)
        progs = ("sync", "emulated", "stack step") if stack else ("sync", "emulated")
        b = async_emulation.step_bytes(f, x, y, method, 4, progs)
        bound = b["sync"] + 2 * b["params"]
        assert b["emulated"] <= bound, (method, b)
        if stack:  # copying the snapshot out of the [M, ...] stack and writing the new weights
            assert b["stack step"] > bound, b  # back into it (the scan loop's step) exceeds it
