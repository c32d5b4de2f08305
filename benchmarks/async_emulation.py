"""Cost of one emulated asynchronous update vs the same method's synchronous step, and its memory.

Setting: M = 16 gamma-timed workers, :class:`jaxstale.asyncdp.AsyncEmulator`. One emulated
update = one call of its host loop's jitted step (``compiled_row_step``): the finishing worker's
gradient at its snapshot (its own buffer, passed by reference), the method's update on the
server; the worker's pull is the new weights themselves (one buffer: nothing is copied).
Baselines on the same model and batch, jitted and donated: the same method as a synchronous step
(its chain at zero staleness: what the method itself costs), the same method with
``stale_params`` a separate buffer that the step rewrites (what the method reads and writes on
any real server, where the stale weights are not the current ones) and a plain
``optax.sgd(lr, 0.9)`` step. Two loops: one jitted call per update from a host loop (the conv
models' loop), and 64 updates inside one ``lax.scan`` for both the emulator (there the snapshots
are an ``[M, ...]`` stack: read with a dynamic slice, written in place) and the synchronous
method (the MLPs' loop). All variants are timed interleaved in one process (``--repeats``
rounds; medians of process CPU time, which a loaded shared box disturbs less than wall time).
Ratios are taken per round (the two steps ran seconds apart) and reported as their median with
the interquartile range: on a shared 2-core VM that range is several percent wide.

Bounds (issue 21, issue 12's restated so that the box's noise cannot decide them): the emulated
update / the stale-copy step ≤ 1.05x (timed), and the emulated step's bytes accessed
(``compiled.cost_analysis()``, XLA's count for the whole program) ≤ the synchronous step's
+ 2 × the parameter bytes (exact, asserted in ``tests/benchmarks/test_async_emulation.py``).
The bytes table also gives the ``[M, ...]`` stack step (``compiled_step``: the scan loop's and
the lanes' program), which copies the snapshot out of the stack and writes it back: over the
bound.

Memory: ``compiled.memory_analysis()`` of the emulated steps — arguments, temporaries and what
aliases donated inputs — next to the plain step's.

Where the time goes (``--profile METHOD``, default ``dc-asgd-a``; ``none`` skips it): XLA:CPU
thunk time per step of the synchronous and the emulated step from ``jax.profiler`` traces, by
kind of op (matmuls, the optimizer's elementwise update, a snapshot's read and write, other).

Run: ``python benchmarks/async_emulation.py [--quick] [--out DIR] [--profile METHOD]``; prints
markdown tables and, unless ``--quick``, writes them to ``<--out>/async_emulation.md`` (default
``benchmarks/results/``), quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks._results import write as write_result
from experiments.runs import markdown_table
from jaxstale import delays, losses, models
from jaxstale.asyncdp import AsyncEmulator, HParams, build_method, server
from jaxstale.loop import jit  # the executors' compiler options: the steps compile alike
from jaxstale.sizes import tree_bytes

LR, MU = 0.01, 0.9
METHODS = ("asgd", "dc-asgd-a", "gap-aware")


def _update(apply: Any, tx: optax.GradientTransformation) -> Any:
    """The method's step, pure: the gradient at ``w`` (the stale weights), ``tx.update`` with
    ``stale_params=w``, applied to ``params``; returns ``(params, opt_state, model_state,
    loss)``."""

    def update(params, opt_state, state, w, staleness, x, y):
        def obj(p):
            logits, new_state = apply(p, state, x, True)
            return losses.cross_entropy(logits, y), new_state

        (loss, new_state), g = jax.value_and_grad(obj, has_aux=True)(w)
        u, opt_state = tx.update(
            g, opt_state, params, stale_params=w, staleness=staleness, worker=0, worker_loss=loss
        )
        return optax.apply_updates(params, u), opt_state, new_state, loss

    return update


def _sync_step(apply: Any, tx: optax.GradientTransformation) -> Any:
    """The method as a synchronous, jitted, donated step (staleness 0: stale == current);
    ``.__wrapped__`` is the pure step (for a scan)."""
    update = _update(apply, tx)

    def step(params, opt_state, state, x, y):
        return update(params, opt_state, state, params, 0, x, y)

    jitted = jit(step, donate_argnums=(0, 1, 2))
    jitted.__wrapped__ = step  # type: ignore[attr-defined]
    return jitted


def _stale_copy_step(apply: Any, tx: optax.GradientTransformation) -> Any:
    """The method with ``stale_params`` a separate buffer: the gradient is taken there, and the
    new weights are written both as the server's and into it (a worker's pull), all donated."""
    update = _update(apply, tx)

    def step(params, opt_state, state, stale, x, y):
        new, opt_state, new_state, loss = update(params, opt_state, state, stale, 1, x, y)
        return new, opt_state, new_state, jax.tree.map(jnp.copy, new), loss

    return jit(step, donate_argnums=(0, 1, 2, 3))


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda a: jnp.array(a, copy=True), tree)


def _model(name: str, kw: dict, shape: tuple, batch: int) -> tuple[Any, jax.Array, jax.Array]:
    """The model (functional) and one fixed random batch, shared by every variant."""
    f = models.functional(models.create(name, input_shape=shape, num_classes=10, seed=0, **kw))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((batch, *shape), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, 10, batch).astype(np.int32))
    return f, x, y


def _host_runner(step: Any, carry: list, x: jax.Array, y: jax.Array, calls: int) -> Any:
    """``calls`` calls of ``step(*carry, x, y) -> (*carry, loss)`` from a host loop."""

    def run():
        for _ in range(calls):
            *carry[:], loss = step(*carry, x, y)
        jax.block_until_ready(loss)

    return run


def _emulated_host_runner(
    f: Any, method: str, sched: Any, x: jax.Array, y: jax.Array, calls: int
) -> Any:
    """``calls`` emulated updates of ``method`` from a host loop (one call of the emulator's
    jitted row step each, its worker rows held by reference as ``AsyncEmulator.run`` holds
    them), walking ``sched`` (``sched.num_workers`` workers) round and round."""
    emu = AsyncEmulator(f.apply, method, sched.num_workers, momentum=MU, loop="host")
    st = emu.init(f.params, f.state, learning_rate=LR)
    rows = {w: emu.pull(st, w) for w in range(sched.num_workers)}
    box = [st._replace(workers=(), worker_model_state=(), velocity=()), st.worker_model_state]
    worker = [jnp.int32(w) for w in sched.worker]
    tau = [jnp.int32(v) for v in sched.staleness]
    t = [0]

    def run():
        for _ in range(calls):
            i = t[0] % len(worker)
            t[0] += 1
            w = int(sched.worker[i])
            box[0], box[1], rows[w], loss = emu.row_update(
                box[0], box[1], rows[w], (x, y, worker[i], tau[i], {})
            )
        jax.block_until_ready(loss)

    return run


def _cost_bytes(lowered: Any) -> float:
    """XLA's "bytes accessed" of a lowered program (``cost_analysis()`` is a dict in JAX 0.10,
    a one-element list in some older versions)."""
    cost = lowered.compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list | tuple) else cost)["bytes accessed"])


PROGRAMS = ("sync", "stale copy", "emulated", "stack step")


def step_bytes(
    f: Any, x: jax.Array, y: jax.Array, method: str, m: int, programs: tuple = PROGRAMS
) -> dict[str, float]:
    """Bytes accessed of one update of ``method`` (``m`` workers) on model ``f`` by each of
    ``programs`` — the sync step, the stale-copy step, the emulated host-loop step
    (``compiled_row_step``), the ``[M, ...]`` stack step (``compiled_step``) — and the
    parameter bytes ``"params"``. The states are shapes (``jax.eval_shape``): only the
    measured programs compile."""
    tx = build_method(method, HParams(LR, MU, m)).tx
    opt = jax.eval_shape(tx.init, f.params)
    emu = AsyncEmulator(f.apply, method, m, momentum=MU, loop="host")
    hp = {"learning_rate": np.float32(LR), "num_workers": np.int32(m)}
    init = lambda: server.init_state(emu.spec(hp), f.params, f.state, m, hp)  # emu.init, unjitted
    st = jax.eval_shape(init)
    inputs = (x, y, jnp.int32(0), jnp.int32(1), {})
    core = st._replace(workers=(), worker_model_state=(), velocity=())
    rows = jax.eval_shape(lambda: (server.index(st.workers, 0), server.index(st.velocity, 0)))
    lower = {
        "sync": lambda: _sync_step(f.apply, tx).lower(f.params, opt, f.state, x, y),
        "stale copy": lambda: _stale_copy_step(f.apply, tx).lower(
            f.params, opt, f.state, f.params, x, y
        ),
        "emulated": lambda: emu.compiled_row_step.lower(core, st.worker_model_state, rows, inputs),
        "stack step": lambda: emu.compiled_step.lower(st, inputs),
    }
    out = {k: _cost_bytes(lower[k]()) for k in programs}
    return {**out, "params": float(tree_bytes(f.params))}


def bench_model(name: str, kw: dict, shape: tuple, batch: int, m: int, calls: int, reps: int):
    """:func:`bench` on the classification model ``name`` and one random batch."""
    f, x, y = _model(name, kw, shape, batch)
    return bench(f, x, y, m, calls, reps)


def bench(
    f: Any,
    x: jax.Array,
    y: jax.Array,
    m: int,
    calls: int,
    reps: int,
    methods: tuple[str, ...] = METHODS,
    chunk: int = 64,
) -> tuple[int, dict[str, np.ndarray]]:
    """``(parameters, {variant: ms per update per round})`` of every variant — plain SGD; per
    method its sync step, stale-copy step, emulated host-loop update, and both in a
    ``lax.scan`` of ``chunk`` updates — timed interleaved (process CPU time) over ``reps``
    rounds of ``calls`` host calls, on model ``f`` (functional) and the batch ``(x, y)``."""
    batch = x.shape[0]
    n_params = sum(int(np.size(p)) for p in jax.tree.leaves(f.params))
    sched = delays.gamma_timed(m, calls * reps + chunk, batch_size=batch, seed=0)
    xs, ys = jnp.broadcast_to(x, (chunk, *x.shape)), jnp.broadcast_to(y, (chunk, *y.shape))

    runners: dict[str, Any] = {}

    def plain_runner(tx: optax.GradientTransformation, scan: bool = False):
        step, carry = _sync_step(f.apply, tx), [_copy(f.params), tx.init(f.params), _copy(f.state)]
        if not scan:
            return _host_runner(step, carry, x, y, calls)
        body = lambda c, xy: (tuple(step.__wrapped__(*c, *xy)[:3]), None)
        chunked = jit(lambda c, xs, ys: jax.lax.scan(body, c, (xs, ys))[0], donate_argnums=0)

        def run():
            carry[:] = chunked(tuple(carry), xs, ys)
            jax.block_until_ready(carry[0])

        return run

    def scan_runner(method: str):
        emu = AsyncEmulator(f.apply, method, m, momentum=MU, loop="scan")
        box = [emu.init(f.params, f.state, learning_rate=LR)]

        def run():
            box[0], loss = emu.run(box[0], xs, ys, sched.worker[:chunk], sched.staleness[:chunk])
            jax.block_until_ready(loss)

        return run

    runners["plain sgd"] = plain_runner(optax.with_extra_args_support(optax.sgd(LR, MU)))
    for method in methods:
        tx = build_method(method, HParams(LR, MU, m)).tx
        runners[f"{method} sync"] = plain_runner(tx)
        stale_carry = [_copy(f.params), tx.init(f.params), _copy(f.state), _copy(f.params)]
        runners[f"{method} stale copy"] = _host_runner(
            _stale_copy_step(f.apply, tx), stale_carry, x, y, calls
        )
        runners[f"{method} sync scan"] = plain_runner(tx, scan=True)
        runners[f"{method} emulated"] = _emulated_host_runner(f, method, sched, x, y, calls)
        runners[f"{method} scan"] = scan_runner(method)
    for run in runners.values():  # compile + warm up
        run()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(reps):
        for key, run in runners.items():
            t0 = time.process_time()
            run()
            times[key].append(
                (time.process_time() - t0) / (chunk if key.endswith("scan") else calls)
            )
    return n_params, {k: 1e3 * np.asarray(v) for k, v in times.items()}


def _ratio(a: np.ndarray, b: np.ndarray, bold: bool = False) -> str:
    """``a / b`` per interleaved round: the median and, in brackets, the interquartile range —
    how far the box's noise moves the ratio."""
    lo, mid, hi = np.percentile(a / b, [25, 50, 75])
    head = f"**{mid:.2f}x**" if bold else f"{mid:.2f}x"
    return f"{head} ({lo:.2f}–{hi:.2f})"


def bound_cells(raw: dict[str, np.ndarray], method: str, nbytes: dict[str, float]) -> list:
    """The bounds table's cells for ``method``: the emulated / stale-copy time ratio (median of
    the rounds' ratios, IQR) against 1.05x and the bytes accessed against sync + 2 × params."""
    emu, stale = raw[f"{method} emulated"], raw[f"{method} stale copy"]
    over = {k: (nbytes[k] - nbytes["sync"]) / nbytes["params"] for k in ("emulated", "stack step")}
    mib = lambda k: f"{nbytes[k] / 2**20:.2f}"
    return [
        _ratio(emu, stale),
        "yes" if np.median(emu / stale) <= 1.05 else "no",
        *map(mib, ("params", "sync", "stale copy", "emulated", "stack step")),
        f"{over['emulated']:+.2f}",
        "yes" if over["emulated"] <= 2 else "no",
        f"{over['stack step']:+.2f}",
    ]


def memory_rows(name: str, kw: dict, shape: tuple, batch: int, ms: list[int]) -> list[list]:
    f, x, y = _model(name, kw, shape, batch)
    pbytes = sum(int(np.size(p)) * 4 for p in jax.tree.leaves(f.params))
    sgd = optax.with_extra_args_support(optax.sgd(LR, MU))
    plain = _sync_step(f.apply, sgd)
    mem = plain.lower(f.params, sgd.init(f.params), f.state, x, y).compile().memory_analysis()
    mib = lambda b: f"{b / 2**20:.2f}"
    cells = lambda mem: [
        mib(mem.argument_size_in_bytes),
        mib(mem.output_size_in_bytes),
        mib(mem.temp_size_in_bytes),
        mib(mem.alias_size_in_bytes),
    ]
    rows = [["plain sgd step", "–", *cells(mem)]]
    for m in ms:
        emu = AsyncEmulator(f.apply, "dc-asgd-a", m, momentum=MU, loop="host")
        st = emu.init(f.params, f.state, learning_rate=LR)
        inputs = (x, y, jnp.int32(0), jnp.int32(0), {})
        core = st._replace(workers=(), worker_model_state=(), velocity=())
        progs = [(f"[M, ...] stack step (scan loop, lanes), M={m}", emu.compiled_step, (st,))]
        if m == ms[0]:  # the host loop's step: its arguments hold one worker's snapshot
            args = (core, st.worker_model_state, emu.pull(st, 0))
            progs.insert(0, ("host-loop step (any M)", emu.compiled_row_step, args))
        for label, fn, args in progs:
            mem = fn.lower(*args, inputs).compile().memory_analysis()
            rows.append(
                [
                    f"emulated dc-asgd-a, {label}",
                    mib(m * pbytes) if "stack" in label else f"{mib(pbytes)} per worker, outside",
                    *cells(mem),
                ]
            )
    return rows


def _category(op: str) -> str:
    """Where an XLA:CPU thunk's time goes, from its op name (names follow XLA's fusion roots)."""
    if op.startswith("dynamic-slice"):
        return "snapshot read (dynamic-slice copy for the matmuls)"
    if "dynamic-update-slice" in op:
        return "snapshot write (the worker's pull, in place)"
    if op.startswith(("ynn_fusion", "dot", "custom-call")):
        return "matmuls and reductions (XNNPACK / dot)"
    if op.startswith("multiply_add_fusion"):
        return "optimizer update (elementwise)"
    return "other (activations, loss, copies)"


def workers_rows(config: tuple, method: str, ms: list[int], calls: int, reps: int) -> list:
    """Emulated / stale-copy time of ``method`` (host loop) for ``ms`` workers on ``config``:
    the emulation reads the finishing worker's snapshot, one of M versions it holds, written M
    updates ago on average; the stale-copy step reads the one it wrote the step before."""
    f, x, y = _model(*config)
    tx = build_method(method, HParams(LR, MU, max(ms))).tx
    stale = [_copy(f.params), tx.init(f.params), _copy(f.state), _copy(f.params)]
    runs = {"stale": _host_runner(_stale_copy_step(f.apply, tx), stale, x, y, calls)}
    for m in ms:
        sched = delays.gamma_timed(m, calls * (reps + 1), batch_size=config[3], seed=0)
        runs[m] = _emulated_host_runner(f, method, sched, x, y, calls)
    for run in runs.values():
        run()  # compile + warm up
    times: dict[Any, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for key, run in runs.items():
            t0 = time.process_time()
            run()
            times[key].append(time.process_time() - t0)
    mb = sum(np.size(p) * 4 for p in jax.tree.leaves(f.params)) / 2**20
    ref = np.asarray(times["stale"])
    return [[m, f"{m * mb:.2f}", _ratio(np.asarray(times[m]), ref)] for m in ms]


def profile_rows(
    method: str, m: int, config: tuple, steps: int = 50, rounds: int = 5
) -> list[list[str]]:
    """Per-step XLA:CPU thunk time of the synchronous and the emulated step of ``method``
    (``config = (model name, kwargs, input shape, batch)``, ``m`` workers; host loop, the runners
    the timings use), by category, from ``jax.profiler`` traces; medians of ``rounds``
    interleaved traces of ``steps`` steps.

    Thunk times are summed over threads, so they add up to more than wall time; the difference
    between the two columns is what the emulation adds."""
    f, x, y = _model(*config)
    tx = build_method(method, HParams(LR, MU, m)).tx
    carry = [_copy(f.params), tx.init(f.params), _copy(f.state)]
    sched = delays.gamma_timed(m, steps * (rounds + 1), batch_size=config[3], seed=0)
    runs = {
        "sync": _host_runner(_sync_step(f.apply, tx), carry, x, y, steps),
        "emulated": _emulated_host_runner(f, method, sched, x, y, steps),
    }
    for run in runs.values():
        run()  # compile + warm up
    traces: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
    for _ in range(rounds):  # interleaved, like the timings above
        for name, run in runs.items():
            with tempfile.TemporaryDirectory() as d:
                jax.profiler.start_trace(d)
                run()
                jax.profiler.stop_trace()
                (trace,) = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)
                with gzip.open(trace) as fh:
                    events = json.load(fh)["traceEvents"]
            cat: dict[str, float] = collections.defaultdict(float)
            for e in events:
                a = e.get("args", {}) if e.get("ph") == "X" else {}
                if a.get("hlo_op") and a.get("hlo_module") in ("jit_step", "jit_row_step"):
                    cat[_category(a["hlo_op"])] += e["dur"] / 1e3 / steps  # us -> ms per step
            cat["total"] = sum(cat.values())
            traces[name].append(cat)
    per_step = {
        k: {c: float(np.median([t.get(c, 0.0) for t in v])) for c in set().union(*v)}
        for k, v in traces.items()
    }
    names = sorted((set(per_step["sync"]) | set(per_step["emulated"])) - {"total"})
    rows = []
    for c in [*names, "total"]:
        s_ms, e_ms = (per_step[k].get(c, 0.0) for k in ("sync", "emulated"))
        rows.append([c, f"{s_ms:.3f}", f"{e_ms:.3f}", f"{e_ms - s_ms:+.3f}"])
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--calls", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--out", default=None, help="folder for async_emulation.md (not with --quick)")
    p.add_argument(
        "--profile",
        default="dc-asgd-a",
        help="method whose per-op time (jax.profiler) is broken down; 'none' to skip",
    )
    args = p.parse_args(argv)
    calls = args.calls or (10 if args.quick else 30)
    reps = args.repeats or (3 if args.quick else 9)
    configs = [
        ("mlp", {"hidden": (512, 512)}, (28, 28, 1), 128, "MLP 784-512-512-10, batch 128"),
        ("mlp", {}, (8, 8, 1), 32, "MLP 64-256-128-10 (digits), batch 32"),
    ]
    body, bounds = [], []
    for name, kw, shape, batch, label in configs:
        _, raw = bench_model(name, kw, shape, batch, args.workers, calls, reps)
        ms = {k: float(np.median(v)) for k, v in raw.items()}
        f, x, y = _model(name, kw, shape, batch)
        for method in METHODS:
            emu = raw[f"{method} emulated"]
            bounds.append(
                [
                    label,
                    method,
                    *bound_cells(raw, method, step_bytes(f, x, y, method, args.workers)),
                ]
            )
            body.append(
                [
                    label,
                    method,
                    f"{ms['plain sgd']:.3f}",
                    f"{ms[f'{method} sync']:.3f}",
                    f"{ms[f'{method} stale copy']:.3f}",
                    f"{ms[f'{method} emulated']:.3f}",
                    _ratio(emu, raw[f"{method} sync"], bold=True),
                    _ratio(emu, raw[f"{method} stale copy"]),
                    _ratio(emu, raw["plain sgd"]),
                    f"{ms[f'{method} sync scan']:.3f}",
                    f"{ms[f'{method} scan']:.3f}",
                    _ratio(raw[f"{method} scan"], raw[f"{method} sync scan"], bold=True),
                ]
            )
    out = [
        f"### One emulated async update (M={args.workers}, gamma delays) vs the same method's "
        f"synchronous step ({jax.default_backend()}, CPU-time medians of {reps} interleaved "
        f"rounds x {calls} calls; ratios: median of the per-round ratios, interquartile range "
        "in brackets)\n"
    ]
    head = ["model", "method", "plain sgd ms", "sync method ms", "sync, stale copy ms"]
    head += ["emulated ms", "emulated / sync method", "emulated / stale copy"]
    head += ["emulated / plain sgd", "sync method in scan ms/step"]
    head += ["emulated in scan ms/update", "scan: emulated / sync"]
    out.append(markdown_table(head, body))
    out.append(
        "\n### Issue 21's bounds: emulated / stale copy ≤ 1.05x (timed, as above) and the "
        "emulated step's bytes accessed ≤ the sync step's + 2 × params (compiled.cost_analysis();"
        " MiB; the [M, ...] stack step is the scan loop's and the lanes' program)\n"
    )
    head = ["model", "method", "emulated / stale copy", "median ≤ 1.05x", "params"]
    head += ["sync", "stale copy", "emulated", "stack step", "(emulated − sync) / params"]
    head += ["≤ 2", "(stack step − sync) / params"]
    out.append(markdown_table(head, bounds))
    config, method = configs[1][:4], "asgd"
    out.append(
        f"\n### Emulated / stale copy by the number of workers: {method}, {configs[1][4]}, host "
        f"loop (CPU-time medians of {reps} interleaved rounds x {calls} calls)\n"
    )
    rows = workers_rows(config, method, [1, 4, 16], calls, reps)
    out.append(markdown_table(["M", "snapshots MiB", "emulated / stale copy"], rows))
    name, kw, shape, batch, label = configs[0]
    ms_list = [1, 4, 16] if args.quick else [1, 4, 16, 32, 64]
    out.append(f"\n### Memory of the compiled step (compiled.memory_analysis(), {label}; MiB)\n")
    cols = ["program", "worker snapshots (M x params)", "arguments", "outputs", "temporaries"]
    cols.append("aliased (outputs in donated inputs)")
    out.append(markdown_table(cols, memory_rows(name, kw, shape, batch, ms_list)))
    if args.profile != "none":
        rows = profile_rows(
            args.profile,
            args.workers,
            (name, kw, shape, batch),
            10 if args.quick else 50,
            2 if args.quick else reps,
        )
        out.append(
            f"\n### Where the time goes: {args.profile}, {label}, M = {args.workers}, "
            "host loop (XLA:CPU thunk time per step from a jax.profiler trace, summed over "
            "threads; ms)\n"
        )
        out.append(markdown_table(["ops", "sync step", "emulated", "emulated − sync"], rows))
    text = "\n".join(out)
    print(text)
    if not args.quick:
        write_result("async_emulation", text, args.out)


if __name__ == "__main__":
    main()
