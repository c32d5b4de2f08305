"""Checkpoints mid-run (:mod:`jaxstale.checkpoint`): a run stopped after a checkpoint and resumed
ends bit for bit where the uninterrupted run ends, on every executor family (both executors),
the constant-delay harness and the synchronous trainer; SIGKILL'd in a child process too; a
checkpoint of another run is refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from jaxstale import checkpoint, delayed, loop, models, train
from jaxstale.checkpoint import Checkpoints
from tests.test_families import _MODEL, _X, _Y, _asyncdp, _localsgd, _pipeline


class _Killed(Exception):
    pass


def _sync(executor: str):
    f = models.functional(_MODEL())
    idx = np.arange(24 * 4).reshape(24, 4) % 24
    x, y = _X[:, 0], _Y[:, 0]
    return train.executor(f.apply, optax.adam(0.01), x, y, idx), f.params, f.state


def _delayed(executor: str):
    f = models.functional(_MODEL())
    idx = np.arange(24 * 4).reshape(24, 4) % 24
    ex = delayed.executor(f.apply, optax.adam(0.01), _X[:, 0], _Y[:, 0], idx, delay=2)
    return ex, f.params, f.state


BUILDERS = {
    "train": (_sync, ("emulate",)),
    "constant-delay": (_delayed, ("emulate",)),
    "asyncdp/dc-asgd-a": (_asyncdp("dc-asgd-a"), ("emulate", "mesh")),
    "pipeline/stash": (_pipeline("stash"), ("emulate", "mesh")),
    "pipeline/2bw": (_pipeline("2bw", lambda: optax.adamw(0.01)), ("emulate", "mesh")),
    "localsgd/async/delayed-nesterov": (_localsgd("async/delayed-nesterov"), ("emulate", "mesh")),
}
#: in make test-slow only (5-7 s each): make test keeps every family, the pipelines on the mesh
#: (and pipeline/stash's emulator in the SIGKILL test below)
SLOW_CASES = {("pipeline/2bw", "emulate"), ("pipeline/stash", "emulate")}
CASES = [(n, e) for n, (_, execs) in BUILDERS.items() for e in execs]


def _run(name, executor, **kw):
    ex, params, state = BUILDERS[name][0](executor)
    eval_data = {"test": (_X[:6, 0], _Y[:6, 0])} if name in ("train", "constant-delay") else None
    every = max(ex.num_rounds // 6, 1)
    (res,) = loop.run(ex, params, state, eval_every=every, eval_data=eval_data, **kw)
    return res


def _same(a: loop.Result, b: loop.Result) -> None:
    np.testing.assert_array_equal(a.losses, b.losses)
    assert a.curve == b.curve and a.diverged == b.diverged
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
    ("name", "executor"),
    [pytest.param(*c, marks=[pytest.mark.slow] if c in SLOW_CASES else []) for c in CASES],
    ids=[f"{n}-{e}" for n, e in CASES],
)
def test_a_resumed_run_ends_where_the_uninterrupted_run_ends(tmp_path, name, executor):
    whole = _run(name, executor)
    ck = Checkpoints(tmp_path / "ck", every=1)
    calls = []

    def stop(rounds, records):
        calls.append(rounds)
        if len(calls) == 3:
            raise _Killed

    with pytest.raises(_Killed):
        _run(name, executor, checkpoint=ck, callback=stop)
    assert checkpoint.latest(ck.directory) == calls[-1]  # the newest kept, the older removed
    assert len(list(Path(ck.directory).glob("*.json"))) == 1
    resumed_from = []
    again = _run(name, executor, checkpoint=ck, callback=lambda r, _: resumed_from.append(r))
    assert resumed_from[0] > calls[-1]  # it went on from the checkpoint, not from the start
    _same(again, whole)


def test_a_sigkilled_run_resumes_bit_for_bit(tmp_path):
    """The process is killed (SIGKILL: no handler, no clean-up) right after a checkpoint."""
    where = tmp_path / "ck"
    child = textwrap.dedent(f"""
        import os, signal
        from tests.test_checkpoint import _run
        from jaxstale.checkpoint import Checkpoints
        def kill(rounds, records):
            if rounds >= 8:
                os.kill(os.getpid(), signal.SIGKILL)
        _run("pipeline/stash", "emulate", checkpoint=Checkpoints({str(where)!r}, 1),
             callback=kill)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    got = subprocess.run([sys.executable, "-c", child], env=env, cwd=Path(__file__).parents[1])
    assert got.returncode == -signal.SIGKILL
    assert checkpoint.latest(where) is not None
    again = _run("pipeline/stash", "emulate", checkpoint=Checkpoints(where, 1))
    _same(again, _run("pipeline/stash", "emulate"))


def test_checkpoints_every_k_updates_and_under_a_context(tmp_path):
    ex, params, state = _sync("emulate")  # 24 updates
    seen = []
    ck = Checkpoints(tmp_path / "a", every=10)
    loop.run(ex, params, state, eval_every=4, checkpoint=ck,
             callback=lambda r, _: seen.append(checkpoint.latest(ck.directory)))  # fmt: skip
    # the first interval end with 10 updates past the last checkpoint: 12, then 24 (the end:
    # no checkpoint, the run is finished)
    assert seen == [None, None, 12, 12, 12, 12]
    with checkpoint.checkpointing(tmp_path / "group", every=4):
        for _ in range(2):
            loop.run(ex, params, state, eval_every=4)
    assert sorted(p.name for p in (tmp_path / "group").iterdir()) == ["run-0", "run-1"]
    assert checkpoint.claim() is None  # outside the context
    with pytest.raises(ValueError, match="positive int"):
        Checkpoints(tmp_path, every=0)


def test_a_checkpoint_of_another_run_is_refused_in_one_line(tmp_path):
    ex, params, state = _sync("emulate")
    ck = Checkpoints(tmp_path / "ck", every=1)
    with pytest.raises(_Killed):
        loop.run(ex, params, state, eval_every=4, checkpoint=ck,
                 callback=lambda r, _: (_ for _ in ()).throw(_Killed()))  # fmt: skip
    with pytest.raises(ValueError, match=r"written by another run \(eval_every differs"):
        loop.run(ex, params, state, eval_every=6, checkpoint=ck)
    other = models.functional(models.create("mlp", input_shape=(6, 1), num_classes=2,
                                            hidden=(16, 8)))  # fmt: skip
    ex2 = train.executor(other.apply, optax.adam(0.01), _X[:, 0], _Y[:, 0],
                         np.arange(96).reshape(24, 4) % 24)  # fmt: skip
    with pytest.raises(ValueError, match=r"leaves differs"):
        loop.run(ex2, other.params, other.state, eval_every=4, checkpoint=ck)
