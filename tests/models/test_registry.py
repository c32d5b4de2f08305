"""Registered models: create() builds them, split() refuses non-staged ones, name errors."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstale import models
from jaxstale.models import zoo


class TwoLayerMLP(nnx.Module):
    """A plain NNX module (not a StagedModel): flatten, ReLU hidden layer, linear output."""

    def __init__(self, din, hidden, dout, rngs):
        self.hidden = nnx.Linear(din, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))


def build_mlp(*, input_shape, num_classes, seed, hidden=8):
    return TwoLayerMLP(int(np.prod(input_shape)), hidden, num_classes, nnx.Rngs(seed))


@pytest.fixture
def registry(monkeypatch):
    """An empty private model registry (no leaks between tests or in from the doctests)."""
    monkeypatch.setattr(zoo, "_REGISTRY", {})


def test_create_builds_a_registered_model(registry):
    models.register_model("two_layer", build_mlp)
    assert models.model_names() == (*models.MODELS, "two_layer")
    assert models.MODELS[:4] == ("mlp", "cnn", "resnet20", "cnn1d")
    model = models.create("two_layer", input_shape=(4, 4, 1), num_classes=3, seed=1, hidden=5)
    assert isinstance(model, TwoLayerMLP) and model.hidden.kernel.shape == (16, 5)
    assert model(jnp.ones((2, 4, 4, 1))).shape == (2, 3)
    again = models.create("two_layer", input_shape=(4, 4, 1), num_classes=3, seed=1, hidden=5)
    np.testing.assert_array_equal(model.out.kernel[...], again.out.kernel[...])
    # the functional form (what the synchronous and data-parallel code uses) works for it
    f = models.functional(model)
    y, _ = f.apply(f.params, f.state, jnp.ones((2, 4, 4, 1)), False)
    np.testing.assert_array_equal(y, model(jnp.ones((2, 4, 4, 1))))


def test_a_registered_staged_model_can_be_split(registry):
    def build(*, input_shape, num_classes, seed):
        rngs = nnx.Rngs(seed)
        din = int(np.prod(input_shape))
        return models.StagedModel(
            [
                zoo.Dense(din, 6, relu=True, flatten=True, rngs=rngs),
                zoo.Dense(6, num_classes, relu=False, flatten=False, rngs=rngs),
            ]
        )

    models.register_model("staged", build)
    model = models.create("staged", input_shape=(2, 2, 1), num_classes=3)
    x = jnp.ones((2, 2, 2, 1))
    for f in models.functional_stages(model, 2):
        x, _ = f.apply(f.params, f.state, x, False)
    np.testing.assert_array_equal(x, model(jnp.ones((2, 2, 2, 1))))


def test_splitting_a_plain_module_is_a_clear_error(registry):
    models.register_model("two_layer", build_mlp)
    model = models.create("two_layer", input_shape=(4, 4, 1), num_classes=3)
    for split in (models.split, models.functional_stages):
        with pytest.raises(TypeError, match=r"Only a StagedModel can be split.*TwoLayerMLP"):
            split(model, 2)


def test_register_model_errors(registry):
    models.register_model("mine", build_mlp)
    with pytest.raises(ValueError, match="already registered; pass overwrite=True"):
        models.register_model("mine", build_mlp)
    models.register_model("mine", lambda **kw: build_mlp(hidden=2, **kw), overwrite=True)
    model = models.create("mine", input_shape=(1, 1, 1), num_classes=2)
    assert model.hidden.kernel.shape == (1, 2)  # the replacement
    for builtin in models.MODELS:
        with pytest.raises(ValueError, match="built-in model"):
            models.register_model(builtin, build_mlp, overwrite=True)
    with pytest.raises(TypeError, match="non-empty string"):
        models.register_model("", build_mlp)
    with pytest.raises(TypeError, match="callable"):
        models.register_model("x", None)
    with pytest.raises(
        ValueError,
        match=r"registered models: mlp, cnn, resnet20, cnn1d, gpt-tiny, gpt-cpu, gpt-deep, "
        r"gpt-gpu, gpt2-small, mine\.",
    ):
        models.create("yours", input_shape=(1, 1, 1), num_classes=2)
    models.register_model("not_a_module", lambda **kw: "nope")
    with pytest.raises(TypeError, match=r"must return an nnx\.Module, got str"):
        models.create("not_a_module", input_shape=(1, 1, 1), num_classes=2)
