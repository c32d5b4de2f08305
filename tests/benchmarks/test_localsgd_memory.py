"""benchmarks/localsgd_memory.py: the emulator carries what the formula says, to the byte."""

from benchmarks import localsgd_memory


def test_carried_state_is_the_formula_for_every_kind():
    for kind in localsgd_memory.KINDS:
        r = localsgd_memory.measure("mlp", kind, 3)
        assert r["parts"] == r["formula"], kind
    text = localsgd_memory.main(["--models", "mlp", "--no-write"])
    assert "| mlp | 44,682 | streaming | 4 |" in text and "| 20P + 4P/F | 20.5 |" in text
