"""LC-ASGD predictor overhead as a share of one emulated asynchronous update.

Setting: one emulated update = the finishing worker's gradient at its stale weights (a
``[M, ...]`` snapshot stack, gather), the server's optax chain, the apply, the worker's pull
(scatter) — one jitted, donated call, as in :class:`jaxstale.asyncdp.AsyncEmulator`. ASGD's chain
is ``optax.sgd(η, 0.9)``; LC-ASGD's is ``chain(lc_asgd(0.1), sgd)`` with the default predictors
(least-squares step predictor, AR(2) loss predictor over a 32-step horizon) and, as an option,
the GRU loss predictor. The extra arguments (``worker_loss``, ``worker``, ``staleness``) are
passed to both. The overhead is ``(t_LC − t_ASGD) / t_ASGD``; the "predictors alone" column is
the LC-ASGD transform on the model's gradient (step + loss predictor, the scale, the multiply)
without the rest of the update, per update inside a 64-update ``lax.scan`` (no dispatch cost).
All variants are timed interleaved (``--repeats`` rounds of ``--calls`` calls; medians), so
machine noise hits them alike.

The seed reports the predictors at about 8% of an iteration on CIFAR-10 and 1.5% on ImageNet:
the predictors' cost is a constant (a few hundred scalar operations and a small eigen-solve),
so its share falls as the model grows. Target: under 10% on the CIFAR-10-sized model.

On a shared CPU the difference of two medians is noisy (a few % of a step either way); the
"predictors alone" column, a direct measurement of what LC-ASGD adds, is the robust number.
Models whose steps run from a host loop (convolutions on the CPU) also pay a fixed ~0.1–0.4 ms
per call for the predictors' extra XLA thunks (an eigen-solve custom call), visible for the
MLP; the emulator runs MLPs inside a ``lax.scan``, where only the in-step cost counts.

Run: ``python benchmarks/lc_asgd_overhead.py [--quick] [--rnn]``; prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.runs import markdown_table
from jaxstale import delays, losses, models
from jaxstale.lc_asgd import lc_asgd, rnn_loss_predictor

LR, MU, LAM = 0.01, 0.9, 0.1


def _async_step(apply: Any, tx: optax.GradientTransformation) -> Any:
    """One emulated async update: gradient at the worker's snapshot, server update, pull."""

    def step(params, opt_state, snaps, state, x, y, worker, tau):
        stale = jax.tree.map(lambda s: s[worker], snaps)

        def obj(p):
            logits, new_state = apply(p, state, x, True)
            return losses.cross_entropy(logits, y), new_state

        (loss, new_state), g = jax.value_and_grad(obj, has_aux=True)(stale)
        u, opt_state = tx.update(
            g,
            opt_state,
            params,
            stale_params=stale,
            staleness=tau,
            worker=worker,
            worker_loss=loss,
        )
        params = optax.apply_updates(params, u)
        snaps = jax.tree.map(lambda s, p: s.at[worker].set(p), snaps, params)
        return params, opt_state, snaps, new_state, loss

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda a: jnp.array(a, copy=True), tree)


def bench_model(
    name: str, kw: dict, shape: tuple, batch: int, m: int, calls: int, repeats: int, rnn: bool
) -> tuple[int, dict[str, float]]:
    f = models.functional(models.create(name, input_shape=shape, num_classes=10, seed=0, **kw))
    n_params = sum(int(np.size(p)) for p in jax.tree.leaves(f.params))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((batch, *shape), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, 10, batch).astype(np.int32))
    sched = delays.gamma_timed(m, calls * (repeats + 1) + 8, batch_size=batch, seed=0)

    variants: dict[str, optax.GradientTransformation] = {
        "asgd": optax.with_extra_args_support(optax.sgd(LR, MU)),
        "lc": optax.chain(lc_asgd(LAM, num_workers=m), optax.sgd(LR, MU)),
    }
    if rnn:
        lp = rnn_loss_predictor()
        variants["lc_rnn"] = optax.chain(
            lc_asgd(LAM, num_workers=m, loss_predictor=lp), optax.sgd(LR, MU)
        )
    stack = lambda t: jax.tree.map(lambda p: jnp.broadcast_to(p, (m, *p.shape)).copy(), t)
    steps = {k: _async_step(f.apply, tx) for k, tx in variants.items()}
    carries = {
        k: [_copy(f.params), tx.init(f.params), stack(f.params), _copy(f.state)]
        for k, tx in variants.items()
    }
    comp = lc_asgd(LAM, num_workers=m)
    g0 = jax.tree.map(jnp.ones_like, f.params)
    chunk = 64

    def alone_chunk(s, ws, taus):  # the transform alone, 64 updates per call: no dispatch
        def body(s, wt):
            u, s = comp.update(g0, s, worker_loss=jnp.float32(2.0), worker=wt[0], staleness=wt[1])
            return s, jax.tree.leaves(u)[0].ravel()[0]

        return jax.lax.scan(body, s, (ws, taus))

    alone = jax.jit(alone_chunk, donate_argnums=0)
    alone_state = [comp.init(f.params)]
    t_idx = {k: 0 for k in [*variants, "alone"]}

    def run(key: str) -> None:
        loss = None
        for _ in range(calls):
            t = t_idx[key] % len(sched.worker)
            t_idx[key] += 1
            w, tau = jnp.int32(sched.worker[t]), jnp.int32(sched.staleness[t])
            if key == "alone":
                ws = jnp.asarray(np.resize(sched.worker, chunk), jnp.int32)
                taus = jnp.asarray(np.resize(sched.staleness, chunk), jnp.int32)
                alone_state[0], loss = alone(alone_state[0], ws, taus)
            else:
                c = carries[key]
                *c[:4], loss = steps[key](*c, x, y, w, tau)
        jax.block_until_ready(loss)

    keys = [*variants, "alone"]
    for key in keys:  # compile + warm up
        run(key)
    times: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(repeats):
        for key in keys:
            t0 = time.perf_counter()
            run(key)
            per = calls * (chunk if key == "alone" else 1)
            times[key].append((time.perf_counter() - t0) / per * 1e3)
    return n_params, {k: float(np.median(v)) for k, v in times.items()}


def bench_emulator_scan(m: int, chunk: int, repeats: int) -> dict[str, float]:
    """ms per update of :class:`~jaxstale.asyncdp.AsyncEmulator` in ``lax.scan`` mode (how the
    emulator runs MLPs), digits MLP, batch 32, for ``asgd`` and ``lc-asgd`` (real times)."""
    from jaxstale.asyncdp import AsyncEmulator

    f = models.functional(models.create("mlp", input_shape=(8, 8, 1), num_classes=10, seed=0))
    rng = np.random.default_rng(0)
    xs = rng.random((chunk, 32, 8, 8, 1), dtype=np.float32)
    ys = rng.integers(0, 10, (chunk, 32)).astype(np.int32)
    sched = delays.gamma_timed(m, chunk, batch_size=32, seed=0)
    assert sched.start_time is not None and sched.finish_time is not None
    extra = {
        "t_comm": sched.start_time.astype(np.float32),
        "t_comp": (sched.finish_time - sched.start_time).astype(np.float32),
    }
    emus, states = {}, {}
    for name in ("asgd", "lc-asgd"):
        emus[name] = AsyncEmulator(f.apply, name, m, momentum=MU, loop="scan")
        states[name] = emus[name].init(f.params, f.state, learning_rate=LR)
        states[name], _ = emus[name].run(
            states[name], xs, ys, sched.worker, sched.staleness, extra
        )  # compile
    times: dict[str, list[float]] = {k: [] for k in emus}
    for _ in range(repeats):
        for name, emu in emus.items():
            t0 = time.perf_counter()
            states[name], loss = emu.run(states[name], xs, ys, sched.worker, sched.staleness, extra)
            jax.block_until_ready(loss)
            times[name].append((time.perf_counter() - t0) / chunk * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv: list[str] | None = None) -> list[list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--large", action="store_true", help="also ResNet-20 at batch 128 (slow on CPU)")
    p.add_argument("--rnn", action="store_true", help="also time the GRU loss predictor")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--calls", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--only", default=None, help="run the configs whose label contains this")
    args = p.parse_args(argv)
    calls = args.calls or (5 if args.quick else 10)
    repeats = args.repeats or (5 if args.quick else 15)
    configs = [
        ("mlp", {}, (8, 8, 1), 32, "MLP 64-256-128-10 (digits), batch 32"),
        ("cnn", {}, (28, 28, 1), 32, "CNN (LeNet-5 style, MNIST), batch 32"),
        ("resnet20", {}, (32, 32, 3), 32, "ResNet-20 (CIFAR-10), batch 32"),
    ]
    if args.large:
        configs.append(("resnet20", {}, (32, 32, 3), 128, "ResNet-20 (CIFAR-10), batch 128"))
    if args.only:
        configs = [c for c in configs if args.only.lower() in c[-1].lower()]
    body = []
    for name, kw, shape, batch, label in configs:
        n, med = bench_model(name, kw, shape, batch, args.workers, calls, repeats, args.rnn)
        row = [
            label,
            f"{n:,}",
            f"{med['asgd']:.2f}",
            f"{med['lc']:.2f}",
            f"{1e3 * med['alone']:.1f}",
            f"**{100 * (med['lc'] - med['asgd']) / med['asgd']:+.1f}%**",
            f"{100 * med['alone'] / med['asgd']:.1f}%",
        ]
        if args.rnn:
            row.append(f"{100 * (med['lc_rnn'] - med['asgd']) / med['asgd']:+.1f}%")
        body.append(row)
    header = [
        "model",
        "params",
        "ASGD update ms",
        "LC-ASGD update ms",
        "predictors alone µs",
        "overhead (LC − ASGD)/ASGD",
        "predictors alone / ASGD",
    ]
    if args.rnn:
        header.append("overhead, GRU loss predictor")
    print(
        f"### LC-ASGD predictor overhead per emulated async update (M={args.workers}, gamma "
        f"delays; {jax.default_backend()}, medians of {repeats} interleaved rounds x {calls} "
        f"calls)\n"
    )
    print(markdown_table(header, body))
    if not args.only or "mlp" in args.only.lower():
        med = bench_emulator_scan(args.workers, 64, repeats)
        share = 100 * (med["lc-asgd"] - med["asgd"]) / med["asgd"]
        print(
            f"\nIn the emulator's own loop for MLPs (``AsyncEmulator``, ``lax.scan`` over 64 "
            f"updates, gamma times passed): asgd {med['asgd']:.3f} ms/update, lc-asgd "
            f"{med['lc-asgd']:.3f} ms/update, overhead **{share:+.1f}%**."
        )
    return body


if __name__ == "__main__":
    main()
