"""``backward="recompute"`` with the stashing policies (issue 54): it was silently ignored (the
residuals stayed); it is honoured where it is exact — the backward recomputes its forward at the
stashed version, the forward's own, so the gradient is the saved backward's bit for bit on both
executors while no residuals are carried — and refused in one line on 2BW's double buffer, where
a recomputed backward parted from the saved one and the executors from each other."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from jaxstale import loop, models, pipeline, schedules
from tests.test_families import _MODEL, _X, _Y

EXACT = ("stash", "asyncpp", "pipedream-lr")


def _run(executor: str, policy: str, backward: str):
    stages = models.functional_stages(_MODEL(), 2)
    tx = optax.sgd(0.05, momentum=0.9)
    ex = pipeline.make(executor, stages, schedules.one_f_one_b(2, 12), policy, tx,
                       _X[:12], _Y[:12], backward=backward)  # fmt: skip
    (res,) = loop.run(ex, [s.params for s in stages], [s.state for s in stages])
    return ex, res


@pytest.mark.parametrize("policy", EXACT)
def test_a_stashing_backward_recomputes_exactly_and_saves_no_residuals(policy):
    program = pipeline.compile(schedules.one_f_one_b(2, 12), policy, backward="recompute")
    assert not program.saves_residuals
    assert pipeline.compile(schedules.one_f_one_b(2, 12), policy).saves_residuals
    for executor in ("emulate", "mesh"):
        ex_s, saved = _run(executor, policy, "saved")
        ex_r, again = _run(executor, policy, "recompute")
        np.testing.assert_array_equal(again.losses, saved.losses)
        for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(saved.params), strict=True):
            np.testing.assert_array_equal(a, b)
        carried = lambda ex: sum(x.size for x in jax.tree.leaves(
            jax.eval_shape(ex.init, [s.params for s in models.functional_stages(_MODEL(), 2)],
                           [s.state for s in models.functional_stages(_MODEL(), 2)])))  # fmt: skip
        assert carried(ex_r) < carried(ex_s)  # the residual slots are gone


@pytest.mark.parametrize("policy", ["2bw", "2bw-ef", "2bw-spectrain"])
def test_recompute_on_2bw_is_refused_in_one_line(policy):
    with pytest.raises(ValueError, match="not available for") as e:
        pipeline.compile(schedules.one_f_one_b(2, 12), policy, backward="recompute")
    assert "\n" not in str(e.value)
