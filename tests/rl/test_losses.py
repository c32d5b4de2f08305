"""jaxstale.rl.losses: every correction's reduction to on-policy REINFORCE, hand-computed
cases against the rules of the public code (verl, AReaL, M2PO, VCPO), and bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale.rl import advantages, losses
from jaxstale.rl.losses import CORRECTIONS

L = math.log


def _grad(fn, logp, *args, **kw):
    return jax.grad(lambda lp: fn(lp, *args, **kw)[0])(jnp.asarray(logp, jnp.float32))


def test_on_policy_every_correction_is_reinforce_bit_for_bit():
    rng = np.random.default_rng(0)
    logp = jnp.asarray(np.log(rng.uniform(0.05, 0.95, (6, 5))), jnp.float32)
    adv = jnp.asarray(rng.normal(size=6), jnp.float32)
    mask = jnp.ones((6, 5))
    ref = _grad(losses.reinforce, logp, logp, adv, mask)
    np.testing.assert_allclose(ref, -adv[:, None] * np.ones((6, 5)) / 30, rtol=1e-6)
    for name, fn in CORRECTIONS.items():
        if name == "vcpo":  # its mean is per sequence then over sequences: equal lengths here
            got = _grad(fn, logp, logp, adv, mask)
            np.testing.assert_allclose(got, ref, rtol=1e-6, err_msg=name)
            continue
        got = _grad(fn, logp, logp, adv, mask)
        np.testing.assert_array_equal(got, ref, err_msg=name)
        loss, st = fn(logp, logp, adv, mask)
        assert float(loss) == pytest.approx(-float(jnp.mean(adv)), rel=1e-6), name
        assert float(st.kept) == 1.0 and float(st.weight) == pytest.approx(1.0), name
    got = jax.grad(lambda lp: losses.decoupled_ppo(lp, logp, logp, adv, mask)[0])(logp)
    np.testing.assert_array_equal(got, ref)
    assert float(losses.ess_ratio(logp, logp, mask)) == pytest.approx(1.0)


def _one(ratio, adv, fn, **kw):
    """A single id with the given ratio π/behav (logp = log ratio, behav = 0)."""
    lp = jnp.array([[L(ratio)]], jnp.float32)
    loss, st = fn(lp, jnp.zeros((1, 1)), jnp.array([adv]), **kw)
    g = jax.grad(lambda x: fn(x, jnp.zeros((1, 1)), jnp.array([adv]), **kw)[0])(lp)
    return float(loss), float(g[0, 0]), st


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "grad", "clipped"),
    [
        (1.5, 1.0, -1.2, 0.0, 1.0),  # r > 1 + ε with A > 0: clipped, no gradient
        (0.5, 1.0, -0.5, -0.5, 0.0),  # r < 1 − ε with A > 0: the unclipped term is larger
        (1.5, -1.0, 1.5, 1.5, 0.0),  # A < 0: −A·r = 1.5 wins, under the dual clip's 3
        (4.0, -1.0, 3.0, 0.0, 0.0),  # the dual clip: −A·c = 3 caps −A·r = 4
    ],
)
def test_ppo_clip_by_hand(ratio, adv, loss, grad, clipped):
    got, g, st = _one(ratio, adv, losses.ppo_clip)
    assert got == pytest.approx(loss, rel=1e-5) and g == pytest.approx(grad, abs=1e-6)
    assert float(st.clipped) == clipped
    assert _one(4.0, -1.0, losses.ppo_clip, dual_clip=None)[0] == pytest.approx(4.0, rel=1e-5)


def test_truncated_importance_sampling_by_hand():
    # token level: weight min(3, 2) = 2 and 0.5; the gradient −A·w (one id, token mean)
    assert _one(3.0, 1.0, losses.tis)[1] == pytest.approx(-2.0)
    assert _one(0.5, 1.0, losses.tis)[1] == pytest.approx(-0.5)
    assert float(_one(3.0, 1.0, losses.tis)[2].clipped) == 1.0
    # sequence level: ratios 2 and 1/4 multiply to 1/2, the weight of both ids
    lp = jnp.array([[L(2.0), L(0.25)]], jnp.float32)
    g = jax.grad(lambda x: losses.tis(x, jnp.zeros((1, 2)), jnp.ones(1), level="sequence")[0])(lp)
    np.testing.assert_allclose(g, [[-0.25, -0.25]], rtol=1e-6)  # −A·0.5 / 2 ids
    # the token level weighs them apart: min(2, 2) and 1/4
    g = jax.grad(lambda x: losses.tis(x, jnp.zeros((1, 2)), jnp.ones(1))[0])(lp)
    np.testing.assert_allclose(g, [[-1.0, -0.125]], rtol=1e-6)


def test_icepop_masks_outside_its_band_and_keeps_the_count():
    lp = jnp.array([[L(0.4), L(1.0), L(6.0)]], jnp.float32)
    loss, st = losses.icepop(lp, jnp.zeros((1, 3)), jnp.array([1.0]))
    assert float(loss) == pytest.approx(-1.0 / 3)  # one id of three, divided by three
    assert float(st.kept) == pytest.approx(1 / 3)
    g = jax.grad(lambda x: losses.icepop(x, jnp.zeros((1, 3)), jnp.array([1.0]))[0])(lp)
    np.testing.assert_allclose(g, [[0.0, -1 / 3, 0.0]], rtol=1e-6)


def test_sequence_mis_drops_sequences_from_the_loss_and_its_count():
    # sequence ratios 3 (above 2: dropped), 1 (kept), 0.4 (below 0.5: dropped)
    lp = jnp.array([[L(3.0), 0.0], [0.0, 0.0], [L(0.4), 0.0]], jnp.float32)
    adv = jnp.array([1.0, 2.0, 3.0])
    loss, st = losses.mis(lp, jnp.zeros((3, 2)), adv)
    assert float(loss) == pytest.approx(-2.0)  # only the middle sequence, over its 2 ids
    assert float(st.kept) == pytest.approx(1 / 3)
    g = jax.grad(lambda x: losses.mis(x, jnp.zeros((3, 2)), adv)[0])(lp)
    np.testing.assert_allclose(g, [[0, 0], [-1.0, -1.0], [0, 0]], atol=1e-7)


def test_decoupled_ppo_puts_the_trust_region_on_the_proximal_policy():
    # behaviour → prox ratio 2 (the weight), prox → θ ratio 1.5 (clipped at 1.2 for A > 0)
    behav, prox = jnp.zeros((1, 1)), jnp.array([[L(2.0)]])
    lp = jnp.array([[L(3.0)]], jnp.float32)
    loss, st = losses.decoupled_ppo(lp, prox, behav, jnp.array([1.0]))
    assert float(loss) == pytest.approx(-1.2 * 2.0, rel=1e-5) and float(st.clipped) == 1.0
    # u = 1 (θ = prox): the gradient is the weight's −A·w; a weight above the cap is masked
    g = jax.grad(lambda x: losses.decoupled_ppo(x, prox, behav, jnp.array([1.0]))[0])(prox)
    assert float(g[0, 0]) == pytest.approx(-2.0, rel=1e-6)
    far = jnp.array([[L(6.0)]])
    g = jax.grad(lambda x: losses.decoupled_ppo(x, far, behav, jnp.array([1.0]))[0])(far)
    assert float(g[0, 0]) == 0.0
    g = jax.grad(lambda x: losses.decoupled_ppo(x, far, behav, jnp.array([1.0]), cap=None)[0])(far)
    assert float(g[0, 0]) == pytest.approx(-6.0, rel=1e-5)


def test_m2po_masks_the_largest_squared_log_ratios_until_the_rest_is_under_the_threshold():
    # (log r)² = 0.25, 0.01, 0, 0.09: the mean of all four 0.0875 ≥ 0.04; without the
    # largest, (0.01 + 0 + 0.09) / 3 = 0.033 < 0.04: one id masked
    lp = jnp.array([[0.5, 0.1, 0.0, 0.3]], jnp.float32)
    keep = losses.m2po_mask(lp, jnp.zeros((1, 4)))
    assert keep.tolist() == [[0.0, 1.0, 1.0, 1.0]]
    # an uncounted id is neither masked nor counted; a tighter threshold masks more
    assert losses.m2po_mask(lp, jnp.zeros((1, 4)), jnp.array([[0, 1, 1, 1]])).tolist() == [
        [0.0, 1.0, 1.0, 1.0]
    ]
    # at 0.004: without the two largest (0.01 + 0) / 2 = 0.005 is still above; only 0 is under
    assert losses.m2po_mask(lp, jnp.zeros((1, 4)), threshold=0.004).tolist() == [
        [0.0, 0.0, 1.0, 0.0]
    ]
    # every id far off: all but the closest one masked
    far = jnp.array([[2.0, 3.0, 1.5]], jnp.float32)
    assert losses.m2po_mask(far, jnp.zeros((1, 3))).tolist() == [[0.0, 0.0, 1.0]]
    # the loss: −r·A on the kept ids, over every counted id (4)
    loss, st = losses.m2po(lp, jnp.zeros((1, 4)), jnp.array([1.0]))
    want = -(math.exp(0.1) + 1.0 + math.exp(0.3)) / 4
    assert float(loss) == pytest.approx(want, rel=1e-6) and float(st.kept) == 0.75


def _authors_m2po_bounds(lp, behav, adv, mask, budget):
    """Infini-AI-Lab/M2PO's rule transcribed loop by loop (``kpo_clip_harmful_tokens`` and
    ``_solve_tau_from_sorted_delta2``), in float64, the 1e-12 tolerances kept."""
    d = (np.asarray(lp, np.float64) - np.asarray(behav, np.float64)).reshape(-1)
    a = np.broadcast_to(np.asarray(adv, np.float64).reshape(-1, 1), np.shape(lp)).reshape(-1)
    m = np.asarray(mask).reshape(-1) > 0
    r = np.exp(d)
    harm = m & (((a > 1e-12) & (r > 1 + 1e-12)) | ((a < -1e-12) & (r < 1 - 1e-12)))
    v = np.sort(d[harm] ** 2)
    if v.size == 0 or v.mean() <= budget + 1e-12:
        return 0.0, 1e5
    target, cs = budget * v.size, np.cumsum(v)
    for k in range(v.size):
        if (v[k] - 1e-12) * (v.size - k - 1) + cs[k] >= target - 1e-12:
            tau = 0.0 if k == 0 else math.sqrt(v[k - 1] - 1e-12)
            return math.exp(-tau), math.exp(tau)
    raise AssertionError("unreachable: k = h - 1 always meets the budget")


def test_m2po_clip_bounds_by_hand():
    # A > 0: the harmful ids are r > 1, (log r)² = 0.25, 0.01, 0.09 (M2 = 0.117 > 0.04); capped
    # at 0.01 the sum is 0.03 < 3 · 0.04, at 0.09 it is 0.19 ≥ 0.12: τ² = 0.01, bounds e^∓0.1
    lp = jnp.array([[0.5, 0.1, -0.2, 0.3]], jnp.float32)
    lo, hi = losses.m2po_clip_bounds(lp, jnp.zeros((1, 4)), jnp.array([1.0]))
    assert (float(lo), float(hi)) == pytest.approx((math.exp(-0.1), math.exp(0.1)), rel=1e-6)
    # the loss: clipped above e^0.1 only (r = e^-0.2 is below lo but not harmful for A > 0)
    loss, st = losses.m2po_clip(lp, jnp.zeros((1, 4)), jnp.array([1.0]))
    assert float(loss) == pytest.approx(-(3 * math.exp(0.1) + math.exp(-0.2)) / 4, rel=1e-6)
    assert float(st.kept) == 1.0 and float(st.clipped) >= 0.5  # the ids at r = e^0.5, e^0.3
    g = _grad(losses.m2po_clip, lp, jnp.zeros((1, 4)), jnp.array([1.0]))
    assert float(g[0, 0]) == 0.0 and float(g[0, 3]) == 0.0  # beyond the bound: no gradient
    assert float(g[0, 2]) == pytest.approx(-math.exp(-0.2) / 4, rel=1e-6)
    # A < 0 and one harmful id: k = 0, τ = 0, every ratio clipped to 1 where that is harmful
    lp = jnp.array([[-0.5, 0.2]], jnp.float32)
    lo, hi = losses.m2po_clip_bounds(lp, jnp.zeros((1, 2)), jnp.array([-1.0]))
    assert (float(lo), float(hi)) == (1.0, 1.0)
    loss, _ = losses.m2po_clip(lp, jnp.zeros((1, 2)), jnp.array([-1.0]))
    assert float(loss) == pytest.approx((1.0 + math.exp(0.2)) / 2, rel=1e-6)
    # within the budget, or nothing harmful: no clip; an uncounted id is not harmful
    small = jnp.array([[0.1, -0.1]], jnp.float32)
    lo, hi = losses.m2po_clip_bounds(small, jnp.zeros((1, 2)), jnp.array([1.0]))
    assert (float(lo), float(hi)) == (0.0, 1e5)
    far = jnp.array([[2.0, 0.1]], jnp.float32)
    lo, hi = losses.m2po_clip_bounds(far, jnp.zeros((1, 2)), jnp.array([1.0]), jnp.array([[0, 1]]))
    assert (float(lo), float(hi)) == (0.0, 1e5)
    # A < 0 at r = e²: not harmful, never clipped by the bounds; the dual clip caps it at −A·3
    up = jnp.array([[2.0]], jnp.float32)
    assert float(losses.m2po_clip(up, jnp.zeros((1, 1)), jnp.array([-1.0]))[0]) == pytest.approx(
        math.exp(2.0), rel=1e-6
    )
    loss, _ = losses.m2po_clip(up, jnp.zeros((1, 1)), jnp.array([-1.0]), dual_clip=3.0)
    g = _grad(losses.m2po_clip, up, jnp.zeros((1, 1)), jnp.array([-1.0]), dual_clip=3.0)
    assert float(loss) == 3.0 and float(g[0, 0]) == 0.0


def test_m2po_clip_bounds_match_the_authors_rule_on_random_batches():
    rng = np.random.default_rng(3)
    bounds = jax.jit(losses.m2po_clip_bounds, static_argnames="budget")
    for trial in range(40):  # ragged batches in one 5 × 8 shape: the mask cuts them
        n, length = rng.integers(1, 6), rng.integers(1, 9)
        behav = np.log(rng.uniform(0.05, 1.0, (5, 8)))
        lp = behav + rng.normal(0, rng.choice([0.05, 0.3, 1.0]), (5, 8))
        adv = rng.normal(size=5) * (rng.uniform(size=5) > 0.2)
        mask = (rng.uniform(size=(5, 8)) > 0.2).astype(np.float32)
        mask[n:], mask[:, length:] = 0.0, 0.0
        budget = float(rng.choice([0.01, 0.04, 0.2]))
        got = bounds(
            jnp.asarray(lp, jnp.float32), jnp.asarray(behav, jnp.float32),
            jnp.asarray(adv, jnp.float32), jnp.asarray(mask), budget=budget,
        )  # fmt: skip
        want = _authors_m2po_bounds(
            np.float32(lp), np.float32(behav), np.float32(adv), mask, budget
        )
        np.testing.assert_allclose([float(x) for x in got], want, rtol=1e-5, err_msg=str(trial))


def test_vcpo_effective_sample_size_and_its_step():
    # sequence weights 3 and 1: (3 + 1)² / (9 + 1) / 2 = 0.8
    lp = jnp.array([[L(3.0), 0.0], [0.0, 0.0]], jnp.float32)
    assert float(losses.ess_ratio(lp, jnp.zeros((2, 2)))) == pytest.approx(0.8, rel=1e-6)
    # one sequence carries all the weight: ρ → 1/n
    lp = jnp.array([[30.0], [0.0], [0.0], [0.0]], jnp.float32)
    assert float(losses.ess_ratio(lp, jnp.zeros((4, 1)))) == pytest.approx(0.25, rel=1e-5)
    # exact whatever the drift: weights e^-200 and e^-200 / 3 (or e^200 and e^200 / 3) still
    # give (1 + 1/3)² / (1 + 1/9) / 2 = 0.8, where summing the weights reads 0 (or NaN)
    for shift in (-200.0, 200.0):
        lp = jnp.array([[shift], [shift - L(3.0)]], jnp.float32)
        assert float(losses.ess_ratio(lp, jnp.zeros((2, 1)))) == pytest.approx(0.8, rel=1e-5)
    lp = jnp.asarray(np.log(np.random.default_rng(0).uniform(0.1, 0.9, (5, 3))), jnp.float32)
    assert float(losses.ess_ratio(lp, lp)) == 1.0  # on-policy: exactly 1, the rate untouched
    tx = optax.chain(optax.sgd(1.0), losses.scale_by_ess("linear"))
    u, _ = tx.update({"w": jnp.array(2.0)}, tx.init({"w": jnp.array(0.0)}), ess_ratio=0.25)
    assert float(u["w"]) == pytest.approx(-0.5)
    u, _ = tx.update({"w": jnp.array(2.0)}, tx.init({"w": jnp.array(0.0)}), ess_ratio=3.0)
    assert float(u["w"]) == pytest.approx(-2.0)  # never above the base rate
    # the loss: per-sequence mean then over sequences (lengths 2 and 1 here)
    lp = jnp.zeros((2, 2), jnp.float32)
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    g = jax.grad(lambda x: losses.vcpo(x, lp, jnp.array([1.0, 1.0]), mask)[0])(lp)
    np.testing.assert_allclose(g, [[-0.25, -0.25], [-0.5, 0.0]], rtol=1e-6)


def test_grpo_advantages_by_hand():
    a = advantages.grpo_advantages(jnp.array([1.0, 0.0, 0.25, 0.25, 1.0, 0.5]), 3)
    # group 1: mean 5/12, unbiased std 0.5204; group 2: (0.25 − 0.5833) / 0.3819 …
    r = np.array([[1.0, 0.0, 0.25], [0.25, 1.0, 0.5]])
    want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(a, want.reshape(-1), rtol=1e-6)
    flat = advantages.grpo_advantages(jnp.array([0.5, 0.5]), 2)
    assert flat.tolist() == [0.0, 0.0]  # no signal in a group of equal rewards
    got = advantages.grpo_advantages(jnp.array([1.0, 0.0]), 2, normalize=False)
    assert got.tolist() == [0.5, -0.5]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: advantages.grpo_advantages(jnp.ones(4), 1), "group_size must be at least 2"),
        (lambda: advantages.grpo_advantages(jnp.ones(5), 2), "5 rewards are not groups of 2"),
        (lambda: losses.tis(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones(2)), "one per"),
        (lambda: losses.tis(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1), level="x"),
         "level must be"),
        (lambda: losses.ppo_clip(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1),
                                 dual_clip=0.5), "dual_clip must be > 1"),
        (lambda: losses.scale_by_ess("cube"), "rule must be"),
        (lambda: losses.tis(jnp.zeros((1, 2)), None, jnp.ones(1)), "log-probabilities missing"),
        (lambda: losses.ppo_clip(jnp.zeros((1, 2)), jnp.array([[-1.0, jnp.nan]]), jnp.ones(1)),
         "missing: 1 of 2 are not finite"),
        (lambda: losses.m2po(jnp.zeros((1, 1)), jnp.ones((1, 1)), jnp.ones(1)), "must be <= 0"),
        (lambda: advantages.grpo_advantages(jnp.array([0.5, 1.5]), 2, reward_range=(0.0, 1.0)),
         r"1 of 2 rewards outside the declared range \[0, 1\] \(first: 1.5\)"),
        (lambda: losses.scale_by_ess(base=0.0), "base must be > 0"),
        (lambda: losses.m2po_clip(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1), budget=0),
         "budget must be > 0"),
        (lambda: losses.m2po_clip(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1),
                                  dual_clip=1.0), "dual_clip must be > 1"),
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()
