"""Model zoo: output shapes, block and parameter counts, seeding, batch-norm variables."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstale import models
from jaxstale.models.zoo import BasicBlock

SHAPES = {
    "mlp": [(8, 8, 1), (28, 28, 1)],
    "cnn": [(8, 8, 1), (28, 28, 1), (32, 32, 3)],
    "resnet20": [(8, 8, 1), (28, 28, 1), (32, 32, 3)],
    "cnn1d": [(40, 1), (7, 3)],
}


@pytest.mark.parametrize(
    ("name", "shape"), [(n, s) for n, shapes in SHAPES.items() for s in shapes]
)
def test_output_shape_and_dtype(name, shape):
    # Shapes only: trace without running (nnx.eval_shape / jax.eval_shape compile nothing).
    model = nnx.eval_shape(lambda: models.create(name, input_shape=shape, num_classes=7))
    f = models.functional(model)
    for train in (False, True):
        y, _ = jax.eval_shape(
            functools.partial(f.apply, train=train),
            f.params,
            f.state,
            jax.ShapeDtypeStruct((3, *shape), jnp.float32),
        )
        assert y.shape == (3, 7)
        assert y.dtype == jnp.float32


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet20"])
def test_forward_runs_on_digits_shape(name):
    kwargs = {"width": 4} if name == "resnet20" else {}  # full width: shapes test above
    model = models.create(name, input_shape=(8, 8, 1), num_classes=10, **kwargs)
    model.eval()
    y = model(jax.random.uniform(jax.random.key(0), (4, 8, 8, 1)))
    assert y.shape == (4, 10) and y.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(y)))
    assert float(jnp.std(y)) > 0


def test_initialisation_is_he_normal_and_jit_independent():
    model = models.create("cnn", input_shape=(8, 8, 1), num_classes=10, seed=3)
    kernel = np.asarray(model.blocks[1].conv.kernel[...])  # 5x5x6 -> 16, followed by ReLU
    assert abs(kernel.std() - np.sqrt(2 / (5 * 5 * 6))) < 0.01
    assert abs(kernel.mean()) < 0.01
    # Under jit the host draw runs through pure_callback: the same weights.
    traced = jax.jit(
        lambda: nnx.state(models.create("cnn", input_shape=(8, 8, 1), num_classes=10, seed=3))
    )()
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(traced), strict=True):
        np.testing.assert_array_equal(a, b)


def test_models_tuple_and_block_counts():
    gpts = ("gpt-tiny", "gpt-cpu", "gpt-deep", "gpt-gpu", "gpt2-small")
    assert models.MODELS == ("mlp", "cnn", "resnet20", "cnn1d", *gpts)
    counts = {
        name: len(models.create(name, input_shape=SHAPES[name][0], num_classes=10).blocks)
        for name in models.MODELS[:4]
    }
    assert counts == {"mlp": 3, "cnn": 5, "resnet20": 11, "cnn1d": 4}
    gpt = {
        name: len(models.create(name, input_shape=(8,), num_classes=10).blocks)
        for name in models.MODELS[4:5]
    }  # the bigger presets: test_gpt (no 85M-weight build)
    assert gpt == {"gpt-tiny": 2}


def test_resnet20_parameter_count_matches_paper():
    # He et al. (2016), Table 6: ResNet-20 has 0.27M parameters (option-A shortcuts add none).
    model = models.create("resnet20", input_shape=(32, 32, 3), num_classes=10)
    assert models.param_count(model) == 269_722
    counts = models.block_param_counts(model)
    assert counts[0] == 3 * 3 * 3 * 16 + 2 * 16  # stem conv (no bias) + BN scale/bias
    assert (
        counts[4] == 9 * 16 * 32 + 9 * 32 * 32 + 4 * 32
    )  # down-sampling block: no shortcut params
    assert counts[-1] == 64 * 10 + 10
    n_bn = sum(isinstance(m, nnx.BatchNorm) for _, m in nnx.iter_modules(model))
    assert n_bn == 19  # stem + 2 per residual block
    stats = nnx.state(model, nnx.BatchStat)
    assert len(jax.tree.leaves(stats)) == 2 * 19  # mean and var per BN


def test_option_a_shortcut_is_subsample_and_zero_pad():
    block = BasicBlock(4, 8, 2, rngs=nnx.Rngs(0))
    # Zero the residual branch's output (BN scale 0, bias 0) to see the shortcut alone.
    block.bn2.scale[...] = jnp.zeros_like(block.bn2.scale[...])
    x = jax.random.uniform(jax.random.key(0), (4, 8, 8, 4))
    y = block(x)
    expected = jnp.pad(x[:, ::2, ::2, :], ((0, 0), (0, 0), (0, 0), (2, 2)))
    np.testing.assert_array_equal(y, jax.nn.relu(expected))


def test_mlp_and_cnn_have_no_batch_stats():
    for name in ("mlp", "cnn"):
        model = models.create(name, input_shape=(8, 8, 1), num_classes=10)
        assert jax.tree.leaves(nnx.state(model, nnx.BatchStat)) == []


def test_bad_seed_raises():
    with pytest.raises(TypeError, match="seed"):
        models.create("mlp", input_shape=(8, 8, 1), num_classes=10, seed=1.5)


def test_seed_determines_weights():
    def leaves(seed):
        model = models.create("cnn", input_shape=(8, 8, 1), num_classes=10, seed=seed)
        return jax.tree.leaves(nnx.state(model, nnx.Param))

    a, b, c = leaves(0), leaves(0), leaves(1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c, strict=True))


def test_model_kwargs_make_small_models():
    small = models.create("resnet20", input_shape=(8, 8, 1), num_classes=10, width=4)
    assert len(small.blocks) == 11
    assert models.param_count(small) < 20_000
    mlp = models.create("mlp", input_shape=(8, 8, 1), num_classes=10, hidden=(16, 16, 16))
    assert len(mlp.blocks) == 4


def test_unknown_model_lists_names():
    with pytest.raises(ValueError, match="mlp, cnn, resnet20"):
        models.create("vgg", input_shape=(8, 8, 1), num_classes=10)


@pytest.mark.parametrize(
    ("shape", "classes"), [((8,), 10), ((8, 8, 0), 10), ((8, 8, 1), 0), ((8.0, 8, 1), 10)]
)
def test_bad_shapes_raise(shape, classes):
    with pytest.raises(ValueError):
        models.create("mlp", input_shape=shape, num_classes=classes)


def test_cnn1d_layers_lengths_and_parameters():
    """Three strided 'SAME' convolutions 40 -> 20 -> 10 -> 5, then a linear layer: by hand,
    (5·1·32 + 32) + 2·(5·32·32 + 32) + (5·32·10 + 10) = 192 + 10,304 + 1,610 parameters."""
    model = models.create("cnn1d", input_shape=(40, 1), num_classes=10)
    assert models.param_count(model) == 192 + 2 * (5 * 32 * 32 + 32) + (5 * 32 * 10 + 10)
    x = jax.random.normal(jax.random.key(0), (2, 40, 1))
    lengths = []
    for block in model.blocks[:-1]:
        x = block(x)
        lengths.append(x.shape[1])
    assert lengths == [20, 10, 5] and float(jnp.min(x)) >= 0.0  # ReLU after each convolution
    odd = models.create("cnn1d", input_shape=(41, 2), num_classes=3, channels=(4,), stride=3)
    assert odd(jnp.zeros((1, 41, 2))).shape == (1, 3)  # ceil(41 / 3) = 14 positions
    assert models.param_count(odd) == (5 * 2 * 4 + 4) + (14 * 4 * 3 + 3)


def test_sequences_take_the_mlp_and_cnn1d_only():
    mlp = models.create("mlp", input_shape=(40, 1), num_classes=10)
    assert mlp(jnp.zeros((3, 40, 1))).shape == (3, 10)
    with pytest.raises(ValueError, match=r"input_shape must be \(L, C\)"):
        models.create("cnn1d", input_shape=(8, 8, 1), num_classes=10)
    with pytest.raises(ValueError, match=r"input_shape must be \(H, W, C\)"):
        models.create("cnn", input_shape=(40, 1), num_classes=10)
    with pytest.raises(ValueError, match="kernel and stride"):
        models.create("cnn1d", input_shape=(40, 1), num_classes=10, stride=0)
