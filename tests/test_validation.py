"""Bad inputs at the edges of the library: one row each, one clear one-line error each.

Every row is ``(name, bad call, exception type, where, argument)``: the message is one line,
starts with ``where`` (the function or method that rejects the input) and names ``argument``.
The call raises at once where the value is concrete; a traced value (inside ``jax.jit``, or
injected by ``optax.inject_hyperparams`` in a jitted step) is reported through
``jax.experimental.checkify`` (``checked`` below), whose error is a ``ValueError`` too.

The command-line cases (``CLI`` below): every experiment's bad flag is argparse's usage line
plus one ``error:`` line naming the flag, exit status 2, and nothing written.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import checkify

from jaxstale import (
    DelaySchedule,
    Policy,
    VersionBuffer,
    asyncdp,
    data,
    dc_asgd,
    delays,
    emulate_async,
    enable_traced_checks,
    gap_aware,
    models,
    predict_weights,
    register_policy,
    run_async,
    schedules,
    staleness_aware,
    staleness_schedule,
    weight_prediction,
)
from jaxstale.asyncdp import AsyncEmulator, HParams, build_method, register_method
from jaxstale.asyncdp.methods import build_lc_asgd_async_bn
from jaxstale.lc_asgd import (
    ar_loss_predictor,
    constant_steps,
    delay_loss,
    lc_asgd,
    least_squares_steps,
    rnn_loss_predictor,
)
from jaxstale.transforms import StalenessSchedule

W = jnp.array([1.0, 2.0])
G = jnp.array([0.5, -1.0])


def checked(fn, *args):
    """Run ``fn(*args)`` jitted under ``checkify`` (traced checks on) and raise what it found."""
    before = enable_traced_checks()
    try:
        err, _ = jax.jit(checkify.checkify(fn))(*args)
    finally:
        enable_traced_checks(before)
    err.throw()


def update(tx, **extra):
    """One ``update`` of ``tx`` from a fresh state."""
    return tx.update(G, tx.init(W), W, **extra)


def injected_update(factory, name, value, static_args=(), **kwargs):
    """One jitted update of ``inject_hyperparams(factory)`` with hyper-parameter ``name`` traced."""
    tx = optax.inject_hyperparams(factory, static_args=static_args)(**kwargs)
    state = tx.init(W)

    def step(v):
        hyper = {**state.hyperparams, name: v}
        return tx.update(G, state._replace(hyperparams=hyper), W, stale_params=W - 1.0)[0]

    checked(step, jnp.float32(value))


def predictor_state():
    tx = weight_prediction(optax.sgd(0.1, momentum=0.9))
    return tx.update(G, tx.init(W), W)[1]


def schedule(**changes):
    """A valid 3-update, 2-worker schedule with ``changes`` applied."""
    ok = DelaySchedule(
        worker=np.array([0, 1, 0]),
        pulled=np.array([0, 0, 1]),
        batch=np.array([0, 1, 2]),
        num_workers=2,
        name="by-hand",
        start_time=np.array([0.0, 0.0, 1.0]),
        finish_time=np.array([1.0, 1.5, 2.0]),
    )
    return ok._replace(**changes)


PER_WORKER = dict(adaptive=True, num_workers=2)

ROWS = [
    # --- gap_aware
    ("gap_aware(0) [user report]", lambda: gap_aware(0), ValueError, "gap_aware", "learning_rate"),
    ("gap_aware negative lr", lambda: gap_aware(-0.1), ValueError, "gap_aware", "learning_rate"),
    ("gap_aware inf lr", lambda: gap_aware(float("inf")), ValueError, "gap_aware", "learning_rate"),
    ("gap_aware nan lr", lambda: gap_aware(float("nan")), ValueError, "gap_aware", "learning_rate"),
    ("gap_aware str lr", lambda: gap_aware("0.1"), TypeError, "gap_aware", "learning_rate"),
    ("gap_aware decay 1", lambda: gap_aware(0.1, decay=1.0), ValueError, "gap_aware", "decay"),
    ("gap_aware eps 0", lambda: gap_aware(0.1, eps=0.0), ValueError, "gap_aware", "eps"),
    (
        "gap_aware momentum 1",
        lambda: gap_aware(0.1, momentum=1.0),
        ValueError,
        "gap_aware",
        "momentum",
    ),
    (
        "gap_aware momentum < 0",
        lambda: gap_aware(0.1, momentum=-0.5),
        ValueError,
        "gap_aware",
        "momentum",
    ),
    (
        "gap_aware statistic",
        lambda: gap_aware(0.1, statistic="paper"),
        ValueError,
        "gap_aware",
        "statistic",
    ),
    (
        "gap_aware traced lr 0 (inject_hyperparams, checkify)",
        lambda: injected_update(gap_aware, "learning_rate", 0.0, ("momentum",), learning_rate=0.1),
        ValueError,
        "gap_aware",
        "learning_rate",
    ),
    (
        "gap_aware traced decay 1 (inject_hyperparams, checkify)",
        lambda: injected_update(gap_aware, "decay", 1.0, ("momentum",), learning_rate=0.1),
        ValueError,
        "gap_aware",
        "decay",
    ),
    # --- dc_asgd
    (
        "dc_asgd(decay=1.5) [user report]",
        lambda: dc_asgd(decay=1.5),
        ValueError,
        "dc_asgd",
        "decay",
    ),
    ("dc_asgd negative lam", lambda: dc_asgd(-0.1), ValueError, "dc_asgd", "lam"),
    ("dc_asgd inf lam", lambda: dc_asgd(float("inf")), ValueError, "dc_asgd", "lam"),
    ("dc_asgd eps 0", lambda: dc_asgd(2.0, adaptive=True, eps=0.0), ValueError, "dc_asgd", "eps"),
    (
        "dc_asgd num_workers 0",
        lambda: dc_asgd(2.0, adaptive=True, num_workers=0),
        ValueError,
        "dc_asgd",
        "num_workers",
    ),
    (
        "dc_asgd num_workers float",
        lambda: dc_asgd(2.0, **{**PER_WORKER, "num_workers": 2.0}),
        TypeError,
        "dc_asgd",
        "num_workers",
    ),
    (
        "dc_asgd num_workers without adaptive",
        lambda: dc_asgd(0.04, num_workers=2),
        ValueError,
        "dc_asgd",
        "num_workers",
    ),
    (
        "dc_asgd per-worker MS, worker missing",
        lambda: update(dc_asgd(2.0, **PER_WORKER), stale_params=W),
        TypeError,
        "dc_asgd.update()",
        "worker",
    ),
    (
        "dc_asgd per-worker MS, worker out of range",
        lambda: update(dc_asgd(2.0, **PER_WORKER), stale_params=W, worker=2),
        ValueError,
        "dc_asgd",
        "worker",
    ),
    (
        "dc_asgd per-worker MS, negative worker",
        lambda: update(dc_asgd(2.0, **PER_WORKER), stale_params=W, worker=jnp.int32(-1)),
        ValueError,
        "dc_asgd",
        "worker",
    ),
    (
        "dc_asgd per-worker MS, traced worker out of range (checkify)",
        lambda: checked(
            lambda i: update(dc_asgd(2.0, **PER_WORKER), stale_params=W, worker=i), jnp.int32(5)
        ),
        ValueError,
        "dc_asgd",
        "worker",
    ),
    (
        "dc_asgd traced negative lam (inject_hyperparams, checkify)",
        lambda: injected_update(dc_asgd, "lam", -1.0, lam=0.04),
        ValueError,
        "dc_asgd",
        "lam",
    ),
    # --- predict_weights
    (
        "predict_weights negative steps [user report]",
        lambda: predict_weights(W, predictor_state(), -1),
        ValueError,
        "predict_weights",
        "steps",
    ),
    (
        "predict_weights traced negative steps (checkify) [user report]",
        lambda: checked(lambda s: predict_weights(W, predictor_state(), s), jnp.int32(-1)),
        ValueError,
        "predict_weights",
        "steps",
    ),
    (
        "predict_weights nesterov momentum 1",
        lambda: predict_weights(W, predictor_state(), 1, rule="nesterov", momentum=1.0),
        ValueError,
        "predict_weights",
        "momentum",
    ),
    (
        "predict_weights nesterov traced momentum (checkify)",
        lambda: checked(
            lambda mu: predict_weights(W, predictor_state(), 1, rule="nesterov", momentum=mu),
            jnp.float32(1.5),
        ),
        ValueError,
        "predict_weights",
        "momentum",
    ),
    (
        "predict_weights unknown rule",
        lambda: predict_weights(W, predictor_state(), 1, rule="adam"),
        ValueError,
        "predict_weights",
        "rule",
    ),
    # --- staleness_aware, staleness_schedule
    (
        "staleness_aware negative staleness",
        lambda: update(staleness_aware(), staleness=-1),
        ValueError,
        "staleness_aware",
        "staleness",
    ),
    (
        "staleness_aware traced negative staleness (checkify)",
        lambda: checked(lambda tau: update(staleness_aware(), staleness=tau), jnp.int32(-1)),
        ValueError,
        "staleness_aware",
        "staleness",
    ),
    (
        "staleness_schedule negative staleness",
        lambda: update(
            optax.inject_hyperparams(optax.sgd)(learning_rate=staleness_schedule(0.1)),
            staleness=-2,
        ),
        ValueError,
        "staleness_schedule",
        "staleness",
    ),
    # --- VersionBuffer
    (
        "VersionBuffer tau out of range",
        lambda: VersionBuffer.create(W, capacity=3).get(5),
        ValueError,
        "VersionBuffer.get",
        "tau",
    ),
    # --- DelaySchedule built by hand
    (
        "DelaySchedule pulled > t [user report]",
        lambda: schedule(pulled=np.array([0, 2, 1])).validate(),
        ValueError,
        "DelaySchedule.validate",
        "pulled",
    ),
    (
        "DelaySchedule pulled < 0",
        lambda: schedule(pulled=np.array([0, -1, 1])).validate(),
        ValueError,
        "DelaySchedule.validate",
        "pulled",
    ),
    (
        "DelaySchedule float pulled",
        lambda: schedule(pulled=np.array([0.0, 0.0, 1.0])).validate(),
        TypeError,
        "DelaySchedule.validate",
        "pulled",
    ),
    (
        "DelaySchedule worker >= M",
        lambda: schedule(worker=np.array([0, 2, 0])).validate(),
        ValueError,
        "DelaySchedule.validate",
        "worker",
    ),
    (
        "DelaySchedule batch < 0",
        lambda: schedule(batch=np.array([0, -1, 2])).validate(),
        ValueError,
        "DelaySchedule.validate",
        "batch",
    ),
    (
        "DelaySchedule length",
        lambda: schedule(batch=np.array([0, 1])).validate(),
        ValueError,
        "DelaySchedule.validate",
        "batch",
    ),
    (
        "DelaySchedule num_workers 0",
        lambda: schedule(num_workers=0).validate(),
        ValueError,
        "DelaySchedule.validate",
        "num_workers",
    ),
    (
        "DelaySchedule start after finish",
        lambda: schedule(start_time=np.array([0.0, 2.0, 1.0])).validate(),
        ValueError,
        "DelaySchedule.validate",
        "start_time",
    ),
    # --- delay-model constructors
    ("constant negative delay", lambda: delays.constant(-1, 5), ValueError, "constant", "tau"),
    (
        "round_robin no workers",
        lambda: delays.round_robin(0, 5),
        ValueError,
        "round_robin",
        "num_workers",
    ),
    (
        "round_robin float workers",
        lambda: delays.round_robin(2.5, 5),
        TypeError,
        "round_robin",
        "num_workers",
    ),
    (
        "gamma_timed straggler_fraction > 1",
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, straggler_fraction=1.5),
        ValueError,
        "gamma_timed",
        "straggler_fraction",
    ),
    (
        "gamma_timed straggler_fraction not a number",
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, straggler_fraction="half"),
        TypeError,
        "gamma_timed",
        "straggler_fraction",
    ),
    (
        "gamma_timed straggler_slowdown < 1",
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, straggler_slowdown=0.5),
        ValueError,
        "gamma_timed",
        "straggler_slowdown",
    ),
    (
        "gamma_timed shape 0",
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, shape=0.0),
        ValueError,
        "gamma_timed",
        "shape",
    ),
    (
        "gamma_timed negative seed",
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=-1),
        ValueError,
        "gamma_timed",
        "seed",
    ),
    (
        "make_schedule unknown model",
        lambda: delays.make_schedule("poisson", 2, 5),
        ValueError,
        "make_schedule",
        "name",
    ),
]


NAN, INF, V, T = float("nan"), float("inf"), ValueError, TypeError
APPLY = lambda p, s, x, train: (x @ p, s)
XB, YB = np.ones((4, 2, 4), np.float32), np.zeros((4, 2), np.int32)
SGD = lambda hp: optax.sgd(0.1)


def emulate(fn=emulate_async, **kw):  # a bad argument is refused before anything runs
    return fn(APPLY, "asgd", jnp.zeros((4, 2)), {}, delays.round_robin(2, 4), XB, YB, **kw)


def hp(lr=0.1, mu=0.9, m=4, cap=None):
    return build_method("sgd", HParams(lr, mu, m, cap))


def lc(lam=0.1, **kw):
    return lc_asgd(lam, **{"num_workers": 2, **kw})


# Hyper-parameters of the API, refused at construction as the command line refuses them (NaN,
# inf, out of range; a learning rate may be 0 on the API: no step, the statistics only), and
# registered names (the command line takes comma-separated lists of them).
# {(where, argument, error): {case: bad call}}
BAD = {
    ("staleness_schedule", "learning_rate", V): {
        "-0.1 [user report]": lambda: staleness_schedule(-0.1),
        "nan": lambda: staleness_schedule(NAN),
        "inf": lambda: staleness_schedule(INF),
    },
    ("staleness_schedule", "learning_rate", T): {"str": lambda: staleness_schedule("1")},
    ("staleness_schedule", "power", V): {
        "nan": lambda: staleness_schedule(0.1, power=NAN),
        "inf": lambda: staleness_schedule(0.1, power=INF),
    },
    ("StalenessSchedule", "learning_rate", V): {"-0.1": lambda: StalenessSchedule(-0.1)},
    ("weight_prediction", "inner", T): {
        "'sgd' [user report]": lambda: weight_prediction("sgd"),
        "optax.sgd, not called": lambda: weight_prediction(optax.sgd),
    },
    ("lc_asgd", "lam", V): {
        "nan [user report]": lambda: lc(NAN),
        "inf": lambda: lc(INF),
        "-inf": lambda: lc(-INF),
    },
    ("lc_asgd", "max_scale", V): {"inf": lambda: lc(max_scale=INF)},
    ("lc_asgd", "horizon", V): {"0": lambda: lc(horizon=0)},
    ("lc_asgd", "horizon", T): {"str": lambda: lc(horizon="8")},
    ("lc_asgd", "capacity", T): {"float": lambda: lc(capacity=4.0)},
    ("lc_asgd", "num_workers", V): {"M > capacity": lambda: lc(num_workers=5, capacity=4)},
    ("ar_loss_predictor", "forget", V): {"nan": lambda: ar_loss_predictor(forget=NAN)},
    ("ar_loss_predictor", "forget", T): {"str": lambda: ar_loss_predictor(forget="x")},
    ("ar_loss_predictor", "rtol", V): {"nan": lambda: ar_loss_predictor(rtol=NAN)},
    ("rnn_loss_predictor", "learning_rate", V): {
        "inf": lambda: rnn_loss_predictor(learning_rate=INF)
    },
    ("rnn_loss_predictor", "window", V): {"0": lambda: rnn_loss_predictor(window=0)},
    ("least_squares_steps", "ridge", V): {"inf": lambda: least_squares_steps(ridge=INF)},
    ("least_squares_steps", "decay", V): {"nan": lambda: least_squares_steps(decay=NAN)},
    ("constant_steps", "value", V): {"inf": lambda: constant_steps(INF)},
    ("delay_loss", "horizon", V): {"0": lambda: delay_loss(ar_loss_predictor(), None, 1.0, 1, 0)},
    ("emulate_async", "learning_rate", V): {
        "-0.1 [user report]": lambda: emulate(learning_rate=-0.1),
        "nan": lambda: emulate(learning_rate=NAN),
        "inf": lambda: emulate(learning_rate=INF),
        "one nan of two": lambda: emulate(learning_rate=[0.1, NAN]),
    },
    ("emulate_async", "learning_rate", T): {"str": lambda: emulate(learning_rate="0.1")},
    ("emulate_async", "momentum", V): {
        "-1 [user report]": lambda: emulate(learning_rate=0.1, momentum=-1),
        "1": lambda: emulate(learning_rate=0.1, momentum=1.0),
        "nan": lambda: emulate(learning_rate=0.1, momentum=NAN),
    },
    ("run_async", "learning_rate", V): {"-0.1": lambda: emulate(run_async, learning_rate=-0.1)},
    ("run", "learning_rate", V): {"-0.1": lambda: emulate(asyncdp.run, learning_rate=-0.1)},
    ("make", "learning_rate", V): {
        "-1": lambda: asyncdp.make(
            "emulate", APPLY, "sgd", delays.constant(0, 2), XB, YB, learning_rate=-1
        )
    },
    ("AsyncEmulator", "momentum", V): {
        "1.5": lambda: AsyncEmulator(APPLY, "asgd", 2, momentum=1.5)
    },
    ("AsyncEmulator.init", "learning_rate", V): {
        "-1": lambda: AsyncEmulator(APPLY, "asgd", 2).init(W, {}, learning_rate=-1.0)
    },
    ("build_method", "learning_rate", V): {"-0.1": lambda: hp(lr=-0.1)},
    ("build_method", "momentum", V): {"1": lambda: hp(mu=1.0), "nan": lambda: hp(mu=NAN)},
    ("build_method", "num_workers", V): {"0": lambda: hp(m=0)},
    ("build_method", "num_workers", T): {"float": lambda: hp(m=2.0)},
    ("build_method", "capacity", V): {"< M": lambda: hp(m=4, cap=2)},
    ("build_lc_asgd_async_bn", "momentum", V): {
        "1": lambda: build_lc_asgd_async_bn(HParams(0.1, 0.0, 2), momentum=1.0)
    },
    ("register_method", "name", V): {
        "'a,b' [user report]": lambda: register_method("a,b", SGD),
        "a space": lambda: register_method("my sgd", SGD),
    },
    ("register_method", "name", T): {"empty": lambda: register_method("", SGD)},
    ("register_model", "name", V): {
        "a comma": lambda: models.register_model("a,b", SGD),
        "a tab": lambda: models.register_model("a\tb", SGD),
    },
    ("register_dataset", "name", V): {"a newline": lambda: data.register_dataset("d\n", SGD)},
    ("register_policy", "policy name", V): {
        "a comma": lambda: register_policy(Policy("stash,2"), overwrite=True)
    },
    ("VersionBuffer.create", "capacity", V): {"0": lambda: VersionBuffer.create(W, 0)},
    ("VersionBuffer.create", "capacity", T): {"float": lambda: VersionBuffer.create(W, 2.0)},
    ("gpipe", "num_stages", V): {"0": lambda: schedules.gpipe(0, 4)},
    ("one_f_one_b", "num_batches", T): {"float": lambda: schedules.one_f_one_b(2, 4.0)},
    ("pipedream_2bw", "delay", V): {"1.0": lambda: schedules.pipedream_2bw(2, 4, delay=1.0)},
}
ROWS += [
    (f"{where} {argument} {case}", call, error, where, argument)
    for (where, argument, error), calls in BAD.items()
    for case, call in calls.items()
]


@pytest.mark.parametrize(
    ("call", "error", "where", "argument"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_bad_input_raises_one_clear_line(call, error, where, argument):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message.strip(), message
    assert message.startswith(where), message
    assert re.search(rf"\b{re.escape(argument)}\b", message), message


def test_good_inputs_pass_the_same_checks():
    # the boundaries that are allowed: decay 0, momentum 0, lam 0, steps 0, staleness 0, τ = t
    gap_aware(1e-3, decay=0.0, momentum=0.0)
    gap_aware(lambda count: 0.0 * count)  # a schedule is not checked
    dc_asgd(0.0, decay=0.0)
    predict_weights(W, predictor_state(), 0, rule="nesterov", momentum=0.0)
    update(staleness_aware(), staleness=0)
    schedule(pulled=np.array([0, 1, 2])).validate()
    checked(lambda s: predict_weights(W, predictor_state(), s), jnp.int32(3))
    # the API's own boundaries: a learning rate of 0 (statistics only), λ < 0, traced values
    staleness_schedule(0.0, power=0.0)
    staleness_schedule(lambda count: -1.0)  # a schedule is not checked
    lc(-0.5, num_workers=jnp.int32(2), capacity=4, max_scale=2.0)
    constant_steps(0.0)
    HParams(lambda count: 0.1, 0.0, 4, capacity=4).validate()
    assert jax.jit(lambda m: HParams(m * 0.1, 0.5, m, 8).validate().num_workers)(4) == 4
    assert hp(lr=0.0, mu=0.0, m=1, cap=1).mode == "async"


# ---------------------------------------------------------------------------------------------
# the command line: (experiment, argv, the flag named, words of the message)
# ---------------------------------------------------------------------------------------------

CLI = [
    ("async_workers", ["--workers", "0,4"], "--workers", "expected an int in [1, inf), got 0"),
    ("async_workers", ["--workers", "4,x"], "--workers", "got 'x'"),
    ("async_workers", ["--lrs", "-0.1"], "--lrs", "in (0, inf)"),
    ("async_workers", ["--lrs", "0.1,,0.2"], "--lrs", "comma-separated list"),
    ("async_workers", ["--lrs", "nan"], "--lrs", "got nan"),
    ("async_workers", ["--momentum", "1.0"], "--momentum", "in [0, 1)"),
    ("async_workers", ["--methods", "sgd,asdg"], "--methods", "unknown method 'asdg'"),
    ("async_workers", ["--seeds", "0"], "--seeds", "expected an int in [1, inf)"),
    ("async_workers", ["--steps", "-5"], "--steps", "expected an int in [1, inf)"),
    ("async_workers", ["--target", "1.5"], "--target", "in (0, 1]"),
    ("async_workers", ["--delay", "poisson"], "--delay", "unknown delay model 'poisson'"),
    ("async_workers", ["--dataset", "imagenet"], "--dataset", "unknown dataset 'imagenet'"),
    ("async_workers", ["--standardize", "zca"], "--standardize", "unknown standardisation"),
    ("async_workers", ["--preset", "nope"], "--preset", "unknown preset 'nope'"),
    ("async_workers", ["--straggler-fraction", "2"], "--straggler-fraction", "in [0, 1]"),
]


@pytest.mark.parametrize(("experiment", "argv", "flag", "words"), CLI)
def test_bad_command_line_is_one_error_line_and_writes_nothing(
    experiment, argv, flag, words, tmp_path, capsys
):
    import importlib

    module = importlib.import_module(f"experiments.{experiment}")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        module.main([*argv, "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{err[-1].split(':')[0]}: error: argument {flag}"), err[-1]
    assert words in err[-1], err[-1]
    assert not out.exists()
