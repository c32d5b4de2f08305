"""The one memo of compiled cores (jaxstale._compile): runs of one structure share a core; after
clear_memo the next run builds (and compiles) its own; a memo entry keeps its keyed objects."""

import gc
import weakref

import optax

from jaxstale import loop, models, pipeline, schedules
from jaxstale._compile import _MEMO, memo


def test_runs_of_one_structure_share_a_core_until_the_memo_is_cleared():
    stages = models.functional_stages(models.gpt(8, 11, layers=2, width=16, heads=2), 2)
    prog = pipeline.compile(schedules.one_f_one_b(2, 4), "vanilla")
    tx = optax.sgd(0.1)
    a = pipeline.emulator.for_program(stages, prog, tx)
    assert pipeline.emulator.for_program(stages, prog, tx) is a  # one compiled round
    assert loop.clear_memo("pipeline.emulator") >= 1
    assert pipeline.emulator.for_program(stages, prog, tx) is not a
    assert loop.clear_memo("no such kind") == 0


def test_an_entry_keeps_the_objects_its_key_names():
    class Fn:
        def __call__(self, x):
            return x

    f = Fn()
    ref = weakref.ref(f)
    memo("test.keep", (id(f),), lambda: 1, keep=f)
    del f
    gc.collect()
    assert ref() is not None  # alive while cached: its id is not reused for another object
    loop.clear_memo("test.keep")
    gc.collect()
    assert ref() is None and not [k for k in _MEMO if k[0] == "test.keep"]
