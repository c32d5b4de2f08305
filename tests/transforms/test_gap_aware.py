"""Gap-Aware: hand-computed penalties, bias correction, η_max over a schedule, momentum."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import GapAwareState, gap_aware

TINY = 1e-30  # ε > 0 is required; this one vanishes next to every sqrt(v̂) below (float32)


def test_penalty_hand_computed():
    tx = gap_aware(0.5, decay=0.0, eps=TINY)  # v̂ = g², C = 0.5 |g|
    g = jnp.array([2.0, 2.0, -4.0, 1.0])
    w = jnp.array([1.0, 1.0, 0.0, 0.0])
    ws = jnp.array([0.0, 1.0, 6.0, 0.5])
    out, state = tx.update(g, tx.init(w), w, stale_params=ws)
    # C = [1, 1, 2, .5]; gap = [1, 0, 6, .5]; G = [2, 1, 4, 2]
    np.testing.assert_allclose(out, [1.0, 2.0, -1.0, 0.5], rtol=1e-7)
    assert isinstance(state, GapAwareState)
    assert int(state.count) == 1 and float(state.eta_max) == 0.5 and state.trace is None


def test_bias_correction_hand_computed():
    gamma, eta = 0.9, 0.1
    tx = gap_aware(eta, decay=gamma, eps=TINY)
    w, ws = jnp.array([1.0]), jnp.array([0.0])
    state = tx.init(w)
    out, state = tx.update(jnp.array([3.0]), state, w, stale_params=w)  # no gap: g unchanged
    np.testing.assert_allclose(state.v, [0.1 * 9.0], rtol=1e-6)
    assert float(out[0]) == 3.0
    out, state = tx.update(jnp.array([1.0]), state, w, stale_params=ws)
    v = 0.9 * 0.9 + 0.1 * 1.0
    v_hat = v / (1 - gamma**2)
    np.testing.assert_allclose(state.v, [v], rtol=1e-6)
    np.testing.assert_allclose(out, [1.0 / (1 + 1.0 / (eta * np.sqrt(v_hat)))], rtol=1e-6)
    # without the bias correction the result would differ noticeably
    assert abs(float(out[0]) - 1.0 / (1 + 1.0 / (eta * np.sqrt(v)))) > 1e-2


def test_eta_max_tracked_over_schedule():
    lrs = [0.1, 0.4, 0.05, 0.2]
    schedule = lambda count: jnp.asarray(lrs)[count]
    tx = gap_aware(schedule, decay=0.0, eps=TINY)
    w, ws, g = jnp.array([1.0]), jnp.array([0.0]), jnp.array([1.0])
    state = tx.init(w)
    for t, eta_max in enumerate([0.1, 0.4, 0.4, 0.4]):
        out, state = tx.update(g, state, w, stale_params=ws)
        np.testing.assert_allclose(state.eta_max, eta_max, rtol=1e-7)
        np.testing.assert_allclose(out, [1.0 / (1 + 1.0 / eta_max)], rtol=1e-6, err_msg=str(t))


def test_raw_statistic_traces_incoming_gradients():
    tx = gap_aware(1.0, decay=0.0, eps=TINY, momentum=0.5, statistic="raw")
    w, ws, g = jnp.array([1.0]), jnp.array([0.0]), jnp.array([1.0])
    state = tx.init(w)
    _, state = tx.update(g, state, w, stale_params=ws)  # u = 1
    out, state = tx.update(g, state, w, stale_params=ws)  # u = 1.5: C = 1.5
    np.testing.assert_allclose(state.trace, [1.5])
    np.testing.assert_allclose(out, [1.0 / (1 + 1.0 / 1.5)], rtol=1e-6)


# Three steps of a 3-element case, worked out in float64 below for both statistics.
ETA, GAMMA, MU = 0.5, 0.5, 0.5
W = np.array([1.0, 2.0, -1.0])
STALE = [W, np.array([0.5, 2.0, -1.5]), np.array([1.25, 1.0, -1.0])]  # step 1 fresh: no gap
STALE = [s.astype(np.float32) for s in STALE]
GRADS = [np.array([2.0, -1.0, 4.0]), np.array([1.0, 3.0, -2.0]), np.array([-2.0, 1.0, 1.0])]


def reference(statistic):
    """Gap-Aware by hand: the lab reads the trace m of its outputs before updating it."""
    v, m, trace, outs = np.zeros(3), np.zeros(3), np.zeros(3), []
    for t, (g, ws) in enumerate(zip(GRADS, STALE, strict=True), start=1):
        if statistic == "lab":
            u = m  # m_{t-1}
        else:
            trace = MU * trace + g
            u = trace
        v = GAMMA * v + (1 - GAMMA) * u**2
        c = ETA * (np.sqrt(v / (1 - GAMMA**t)) + TINY)
        gap = np.abs(W - ws)
        out = g / (1 + np.where(gap == 0, 0.0, gap / c))
        m = MU * m + out
        outs.append(out)
    return outs, v, (m if statistic == "lab" else trace)


def run(statistic):
    tx = gap_aware(ETA, decay=GAMMA, eps=TINY, momentum=MU, statistic=statistic)
    state, outs = tx.init(jnp.asarray(W, jnp.float32)), []
    for g, ws in zip(GRADS, STALE, strict=True):
        out, state = tx.update(
            jnp.asarray(g, jnp.float32), state, jnp.asarray(W, jnp.float32), stale_params=ws
        )
        outs.append(np.asarray(out, np.float64))
    return outs, state


@pytest.mark.parametrize("statistic", ["lab", "raw"])
def test_statistics_hand_computed(statistic):
    outs, state = run(statistic)
    want, v, trace = reference(statistic)
    for t, (a, b) in enumerate(zip(outs, want, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"{statistic} step {t + 1}")
    np.testing.assert_allclose(state.v, v, rtol=1e-6)
    np.testing.assert_allclose(state.trace, trace, rtol=1e-6)


def test_lab_statistic_by_hand_step_two():
    # First coordinate, step 2 (g = 1, gap = 0.5); step 1 was fresh (g = 2, passed through).
    # lab: u_2 = m_1 = 2, v_2 = 0.5·v_1 + 0.5·2² = 2 (v_1 = 0.5·m_0² = 0),
    #      v̂_2 = 2 / (1 − 0.5²) = 8/3, C = 0.5·sqrt(8/3), out = 1 / (1 + 0.5 / C) ≈ 0.6202
    # raw: u_1 = 2, v_1 = 2; u_2 = 0.5·2 + 1 = 2, v_2 = 0.5·2 + 0.5·4 = 3, v̂_2 = 4, C = 1,
    #      out = 1 / (1 + 0.5) = 2/3
    lab, raw = run("lab")[0], run("raw")[0]
    np.testing.assert_allclose(lab[1][0], 1.0 / (1 + 0.5 / (0.5 * np.sqrt(8 / 3))), rtol=1e-6)
    np.testing.assert_allclose(lab[1][0], 0.62020410, rtol=1e-6)
    np.testing.assert_allclose(raw[1][0], 2 / 3, rtol=1e-6)


def test_statistics_differ_with_momentum_and_agree_without():
    lab, raw = run("lab")[0], run("raw")[0]
    np.testing.assert_array_equal(lab[0], raw[0])  # step 1 has no gap
    assert np.max(np.abs(lab[2] - raw[2])) > 1e-2
    # without momentum both read the raw gradient: identical
    outs = {}
    for statistic in ("lab", "raw"):
        tx = gap_aware(ETA, decay=GAMMA, statistic=statistic)
        state, outs[statistic] = tx.init(jnp.asarray(W, jnp.float32)), []
        for g, ws in zip(GRADS, STALE, strict=True):
            out, state = tx.update(
                jnp.asarray(g, jnp.float32), state, jnp.asarray(W, jnp.float32), stale_params=ws
            )
            outs[statistic].append(np.asarray(out))
        assert state.trace is None
    for a, b in zip(outs["lab"], outs["raw"], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("statistic", ["lab", "raw"])
def test_zero_staleness_is_bit_for_bit_sgd(statistic):
    rng = np.random.default_rng(0)
    inner = optax.sgd(0.1, momentum=0.9)
    tx = optax.chain(gap_aware(0.1, momentum=0.9, statistic=statistic), inner)
    w = w_ref = jnp.asarray(rng.standard_normal(3), jnp.float32)
    state, ref_state = tx.init(w), inner.init(w)
    for _ in range(3):
        g = jnp.asarray(rng.standard_normal(3), jnp.float32)
        upd, state = tx.update(g, state, w, stale_params=w)
        ref_upd, ref_state = inner.update(g, ref_state, w_ref)
        w, w_ref = optax.apply_updates(w, upd), optax.apply_updates(w_ref, ref_upd)
        assert np.asarray(upd).tobytes() == np.asarray(ref_upd).tobytes()
    assert np.asarray(w).tobytes() == np.asarray(w_ref).tobytes()


def test_eps_and_errors():
    tx = gap_aware(1.0, decay=0.0, eps=1.0)
    out, _ = tx.update(
        jnp.array([1.0]), tx.init(jnp.zeros(1)), jnp.array([2.0]), stale_params=jnp.array([0.0])
    )
    np.testing.assert_allclose(out, [1.0 / (1 + 2.0 / 2.0)])  # C = 1*(1+1)
    with pytest.raises(TypeError, match="stale_params"):
        tx.update(jnp.ones(1), tx.init(jnp.zeros(1)), jnp.zeros(1))
    with pytest.raises(ValueError, match="momentum"):
        gap_aware(0.1, momentum=-1.0)
    with pytest.raises(ValueError, match="statistic must be one of 'lab', 'raw'"):
        gap_aware(0.1, statistic="paper")


def test_works_with_inject_hyperparams():
    tx = optax.inject_hyperparams(gap_aware)(learning_rate=0.5, decay=0.0, eps=TINY)
    out, _ = tx.update(
        jnp.array([2.0]), tx.init(jnp.zeros(1)), jnp.array([1.0]), stale_params=jnp.array([0.0])
    )
    np.testing.assert_allclose(out, [1.0])
