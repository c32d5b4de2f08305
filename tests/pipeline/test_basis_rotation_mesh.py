"""Basis rotation in both pipeline executors: the mesh updates each stage's pytree (its state
is not the flat vector's), and the two executors agree until early covariances' null spaces
let float32 rounding steer the bases (jaxstale.transforms.basis_rotation, "Numerics")."""

import jax
import numpy as np
import optax
import pytest

import jaxstale
from jaxstale import loop, models, pipeline, schedules

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 4, 6, 1)).astype(np.float32)
Y = (X[..., 0, 0] > 0).astype(np.int32)


def _losses(executor, policy, tx, **kw):
    model = models.create("mlp", input_shape=(6, 1), num_classes=2, hidden=(8, 8))
    stages = models.functional_stages(model, 2)
    momentum = 0.9 if pipeline.POLICIES[policy].predict == "nesterov" else None
    ex = pipeline.make(
        executor, stages, schedules.one_f_one_b(2, 12), policy, tx, X, Y, momentum=momentum, **kw
    )
    (res,) = loop.run(ex, [s.params for s in stages], [s.state for s in stages])
    return np.asarray(res.losses)


@pytest.mark.parametrize(
    ("policy", "geometry"),
    # stash-bilateral (14 s) in make test-slow; the other pair keeps both executors here
    [pytest.param("stash", "bilateral", marks=pytest.mark.slow), ("nesterov", "unilateral")],
)
def test_both_executors_agree_while_the_bases_are_well_posed(policy, geometry):
    tx = lambda: jaxstale.basis_rotation(0.01, weight_decay=0.1, frequency=3, geometry=geometry)
    em, me = _losses("emulate", policy, tx()), _losses("mesh", policy, tx())
    np.testing.assert_allclose(me[:2], em[:2], rtol=1e-4, atol=1e-5)  # the first updates
    assert np.isfinite(me).all() and np.isfinite(em).all()
    assert np.abs(me - em).max() < 0.05  # then they part, by rounding, not by a wrong rule


def test_the_mesh_rotates_pytrees_not_the_flat_vector():
    """Without stage trees the mesh would hand basis rotation one flat vector (nothing to
    rotate: Adam); its state's size tells the mesh to update pytrees, as passing
    ``stage_trees=True`` does — and a rotating run is not Adam's."""
    tx = lambda: jaxstale.basis_rotation(0.01, frequency=3)
    auto, forced = _losses("mesh", "stash", tx()), _losses("mesh", "stash", tx(), stage_trees=True)
    np.testing.assert_array_equal(auto, forced)
    adam = _losses("mesh", "stash", optax.adamw(0.01, weight_decay=0.0))
    assert np.abs(auto - adam).max() > 1e-3
    assert jax.device_count() >= 2
