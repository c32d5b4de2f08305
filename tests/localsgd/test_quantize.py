"""jaxstale.localsgd.quantize: torchft's rowwise absmax fp8 (e4m3) exchange, and fp4 (e2m1)."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxstale.localsgd.quantize import FP8_MAX, exchange_mean, fp8_mean, fp8_rowwise, rowwise


def _reference(x, dtype=ml_dtypes.float8_e4m3fn, big=FP8_MAX):
    """Rowwise absmax e4m3 (or ``dtype``) in numpy with ml_dtypes (round to nearest even)."""
    rows = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(-1, 1)
    top = np.abs(rows).max(axis=1, keepdims=True)
    scale = np.where(top > 0, np.float32(big) / np.where(top > 0, top, 1), 1).astype(np.float32)
    q = np.clip(rows * scale, -big, big).astype(dtype)
    return (q.astype(np.float32) / scale).reshape(x.shape)


def test_rows_keep_their_absmax_and_lose_at_most_a_sixteenth():
    x = np.random.default_rng(0).normal(size=(16, 3, 5)).astype(np.float32)
    got = np.asarray(fp8_rowwise(jnp.asarray(x)))
    np.testing.assert_allclose(got, _reference(x), rtol=1e-6)  # the same e4m3 codes
    rows, back = x.reshape(16, -1), got.reshape(16, -1)
    top = np.abs(rows).max(axis=1)
    np.testing.assert_allclose(np.abs(back).max(axis=1), top, rtol=1e-6)  # the max maps to 448
    assert np.all(np.abs(back - rows) <= np.abs(rows) / 16 + 1e-6 * top[:, None])  # 3 mantissa bits


def test_a_vector_is_a_column_and_a_zero_row_stays_zero():
    v = jnp.array([0.123456, -7.5, 1e-3])
    np.testing.assert_allclose(np.asarray(fp8_rowwise(v)), np.asarray(v), rtol=1e-6)  # exact
    z = jnp.zeros((2, 4))
    assert np.asarray(fp8_rowwise(z)).tolist() == [[0.0] * 4] * 2
    assert float(fp8_rowwise(jnp.float32(3.3))) == pytest.approx(3.3)


def test_the_mean_is_requantized_after_a_float32_sum():
    d = np.random.default_rng(1).normal(size=(3, 4, 6)).astype(np.float32)
    got = np.asarray(fp8_mean({"w": jnp.asarray(d)})["w"])
    want = _reference(sum(_reference(d[m]) for m in range(3)) / 3)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.max(np.abs(got - d.mean(0))) < 0.2 * np.abs(d.mean(0)).max()


def test_fp4_is_e2m1_rowwise_and_the_exchange_names_pick_the_format():
    x = np.random.default_rng(2).normal(size=(8, 6)).astype(np.float32)
    got = np.asarray(rowwise(jnp.asarray(x), "fp4"))
    np.testing.assert_allclose(got, _reference(x, ml_dtypes.float4_e2m1fn, 6.0), rtol=1e-6)
    codes = np.unique(np.round(np.abs(got) / np.abs(x).max(1, keepdims=True) * 6.0, 4))
    assert set(codes) <= {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}  # e2m1's magnitudes
    d = jnp.asarray(np.random.default_rng(3).normal(size=(3, 4, 6)).astype(np.float32))
    np.testing.assert_array_equal(exchange_mean(d, "fp32"), jnp.mean(d, axis=0))
    np.testing.assert_array_equal(exchange_mean(d, "fp8"), fp8_mean(d))
    four = np.asarray(exchange_mean(d, "fp4"))
    want = _reference(sum(_reference(np.asarray(d[m]), ml_dtypes.float4_e2m1fn, 6.0)
                          for m in range(3)) / 3, ml_dtypes.float4_e2m1fn, 6.0)  # fmt: skip
    np.testing.assert_allclose(four, want, rtol=1e-6)
