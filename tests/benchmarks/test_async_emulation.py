"""The asynchronous-emulation benchmark's profile (issue 12): where an emulated update's time goes.

No timing is asserted (timings belong in ``benchmarks/results``); what holds exactly is which ops
run: the synchronous step moves no snapshot, the emulated step reads the worker's snapshot out of
the ``[M, ...]`` stack and writes the new weights into its row.
"""

from benchmarks import async_emulation


def test_category_names_the_snapshot_ops():
    assert async_emulation._category("dynamic-slice_bitcast_fusion.2").startswith("snapshot read")
    assert async_emulation._category("bitcast_dynamic-update-slice_fusion").startswith(
        "snapshot write"
    )
    assert async_emulation._category("ynn_fusion.6").startswith("matmuls")
    assert async_emulation._category("multiply_add_fusion.13").startswith("optimizer update")
    assert async_emulation._category("copy.4").startswith("other")


def test_profile_only_the_emulated_step_moves_a_snapshot():
    rows = {
        r[0]: r[1:]
        for r in async_emulation.profile_rows(
            "dc-asgd-a", 4, ("mlp", {"hidden": (512, 512)}, (28, 28, 1), 128), steps=2, rounds=1
        )
    }
    read = rows["snapshot read (dynamic-slice copy for the matmuls)"]
    write = rows["snapshot write (the worker's pull, in place)"]
    assert float(read[0]) == 0.0 < float(read[1])  # sync: none; emulated: the copy
    assert float(write[0]) == 0.0 < float(write[1])
    assert float(rows["matmuls and reductions (XNNPACK / dot)"][0]) > 0
    assert float(rows["total"][1]) > 0
