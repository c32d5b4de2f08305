"""jaxstale.rl.tasks and jaxstale.rl.sampler: the reverse task's reward, on-policy and stale
sampling from a VersionBuffer, the stored behaviour log-probabilities."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import models
from jaxstale.rl.sampler import logprobs, sample, sample_stale
from jaxstale.rl.tasks import Reverse
from jaxstale.versions import VersionBuffer

TASK = Reverse(length=4, symbols=5)
# batches of 16 prompts (4 for a share of them) wherever the test allows: the sampler compiles
# once per shape, and one shape shares it across the file's tests (53 s -> 27 s, one run each)


@pytest.fixture(scope="module")
def policy():
    m = models.create("gpt-tiny", input_shape=(TASK.context,), num_classes=TASK.vocab)
    f = models.functional(m)
    return (lambda p, x: f.apply(p, f.state, x, False)[0]), f.params


def test_the_reward_counts_the_reversed_positions():
    p = jnp.array([[0, 1, 2, 3], [4, 4, 0, 1]])
    assert TASK.reward(p, TASK.targets(p)).tolist() == [1.0, 1.0]
    got = TASK.reward(p, jnp.array([[3, 2, 0, 0], [0, 0, 0, 0]]))
    assert got.tolist() == [0.75, 0.25]  # 3, 2, ·, 0 right; · 0 · · right
    assert TASK.sequence(p, TASK.targets(p))[0].tolist() == [0, 1, 2, 3, 5, 3, 2, 1, 0]
    assert (TASK.vocab, TASK.sep, TASK.context) == (6, 5, 8)
    with pytest.raises(ValueError, match="responses"):
        TASK.reward(p, p[:, :3])
    for bad in ({"length": 0}, {"symbols": 1}):
        with pytest.raises(ValueError):
            Reverse(**bad)


def test_sampling_stores_the_behaviour_log_probabilities(policy):
    apply, params = policy
    prompts = TASK.prompts(jax.random.key(0), 16)
    r = jax.jit(lambda p, k: sample(apply, p, TASK, prompts, k))(params, jax.random.key(1))
    assert r.responses.shape == r.logp.shape == (16, 4) and r.responses.dtype == jnp.int32
    assert bool(jnp.all((r.responses >= 0) & (r.responses < TASK.vocab)))
    assert r.versions.tolist() == [0, 0, 0, 0] and bool(jnp.all(r.logp <= 0))
    teacher = logprobs(apply, params, TASK, prompts, r.responses)  # one forward, the same ids
    np.testing.assert_allclose(teacher, r.logp, rtol=1e-5, atol=2e-6)
    # the same key, the same rollout; a temperature ≤ 0 is refused
    again = sample(apply, params, TASK, prompts, jax.random.key(1))
    assert bool(jnp.all(again.responses == r.responses))
    with pytest.raises(ValueError, match="temperature"):
        sample(apply, params, TASK, prompts, jax.random.key(1), temperature=0.0)


def _versions(params, k=3):
    """A buffer of ``k`` versions, each the last moved by a fixed step, newest first."""
    buf = VersionBuffer.create(params, k)
    w = params
    for i in range(k - 1):
        w = jax.tree.map(lambda a, i=i: a + 0.5 * (i + 1) * jnp.sign(a), w)
        buf = buf.push(w)
    return buf


def test_a_stale_rollout_is_the_rollout_of_the_old_version(policy):
    apply, params = policy
    buf = _versions(params)
    prompts, key = TASK.prompts(jax.random.key(2), 16), jax.random.key(3)
    for tau in (0, 1, 2):
        stale = sample_stale(apply, buf, tau, TASK, prompts, key)
        plain = sample(apply, buf.get(tau), TASK, prompts, key)
        assert bool(jnp.all(stale.responses == plain.responses)), tau
        np.testing.assert_array_equal(stale.logp, plain.logp)
        assert stale.versions.tolist() == [tau] * 4
    assert not bool(
        jnp.all(
            sample_stale(apply, buf, 2, TASK, prompts, key).responses
            == sample_stale(apply, buf, 0, TASK, prompts, key).responses
        )
    )


def test_in_flight_updates_draw_each_position_from_its_own_version(policy):
    apply, params = policy
    buf = _versions(params)
    prompts, key = TASK.prompts(jax.random.key(4), 16), jax.random.key(5)
    taus = jnp.array([2, 2, 1, 0])  # newer weights arrive mid-generation
    r = sample_stale(apply, buf, taus, TASK, prompts, key)
    assert r.versions.tolist() == [2, 2, 1, 0]
    # each id's stored log-probability is its own version's, teacher forced on the same ids
    for t, tau in enumerate(taus.tolist()):
        lp = logprobs(apply, buf.get(tau), TASK, prompts, r.responses)[:, t]
        np.testing.assert_allclose(
            lp, r.logp[:, t], rtol=1e-5, atol=2e-6
        )  # ~2 ulp apart (scan vs one forward)
    # the first two ids are τ = 2's draws exactly (the same key stream)
    old = sample_stale(apply, buf, 2, TASK, prompts, key)
    assert bool(jnp.all(r.responses[:, :2] == old.responses[:, :2]))


@pytest.mark.parametrize(
    ("taus", "message"),
    [(-1, r"τ must be in \[0, 3\).*got -1"), (3, "got 3"), (jnp.array([0, 1]), "2 staleness")],
)
def test_bad_staleness_is_one_clear_line(policy, taus, message):
    apply, params = policy
    prompts = TASK.prompts(jax.random.key(0), 2)
    with pytest.raises(ValueError, match=message):
        sample_stale(apply, _versions(params), taus, TASK, prompts, jax.random.key(0))


def test_the_tiny_gpt_learns_to_reverse_from_supervision(policy):
    """The task is learnable by the smallest GPT in a few hundred CPU steps: the supervised
    start a reinforcement-learning run begins from."""
    apply, params = policy
    tx = optax.adam(3e-3)

    @jax.jit
    def step(p, o, key):
        prompts = TASK.prompts(key, 64)
        resp = TASK.targets(prompts)
        loss = lambda q: -jnp.mean(logprobs(apply, q, TASK, prompts, resp))
        lv, g = jax.value_and_grad(loss)(p)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, lv

    p, o = params, tx.init(params)
    before = float(jnp.mean(TASK.reward(*_greedy(apply, p))))
    for i in range(300):
        p, o, lv = step(p, o, jax.random.key(100 + i))
    after = float(jnp.mean(TASK.reward(*_greedy(apply, p))))
    assert before < 0.4 and after > 0.9, (before, after, float(lv))


def _greedy(apply, params):
    prompts = TASK.prompts(jax.random.key(7), 128)
    r = sample(apply, params, TASK, prompts, jax.random.key(8), temperature=1e-3)
    return prompts, r.responses


def test_a_share_of_the_batch_draws_the_ids_the_whole_batch_would(policy):
    """Samplers on a data axis each draw their rows with those rows' noise: the split does not
    change a single id (and the draw is jax.random.categorical's)."""
    apply, params = policy
    buf = VersionBuffer.create(params, 2)
    prompts = TASK.prompts(jax.random.key(4), 16)
    whole = sample_stale(apply, buf, 1, TASK, prompts, jax.random.key(5))
    for first in (0, 4, 8, 12):
        part = sample_stale(apply, buf, 1, TASK, prompts[first : first + 4], jax.random.key(5),
                            rows=(first, 16))  # fmt: skip
        np.testing.assert_array_equal(part.responses, whole.responses[first : first + 4])
    logits = jax.random.normal(jax.random.key(6), (64, TASK.vocab))
    got = jnp.argmax(logits + jax.random.gumbel(jax.random.key(7), logits.shape), axis=-1)
    assert bool(jnp.all(got == jax.random.categorical(jax.random.key(7), logits)))


def test_traced_checks_turned_on_after_a_first_sample_still_check(policy):
    """The compiled sampler is keyed on the traced-check setting: a buffer read at an
    out-of-range traced τ is reported once checks are on, though the same call ran before."""
    from jax.experimental import checkify

    from jaxstale import enable_traced_checks

    apply, params = policy
    buf, prompts = _versions(params), TASK.prompts(jax.random.key(0), 4)
    draw = lambda t: sample_stale(apply, buf, t, TASK, prompts, jax.random.key(1)).logp
    jax.jit(draw)(jnp.array(5))  # checks off: clamped, no error
    before = enable_traced_checks()
    try:
        err, _ = jax.jit(checkify.checkify(draw))(jnp.array(5))
        with pytest.raises(checkify.JaxRuntimeError, match="outside"):
            err.throw()
    finally:
        enable_traced_checks(before)
