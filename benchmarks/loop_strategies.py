"""How to loop training steps: host loop vs rolled vs unrolled scan; vmap vs sequential seeds.

For each model (MLP, CNN, ResNet-20) this times the trainer's own compiled step functions
(``jaxstale.train``: the masked, buffer-donating step) on digits-sized inputs:

- steps/second of a **host** loop of the jitted step, a **rolled** ``lax.scan`` over ``--steps``
  pre-batched steps, and an **unrolled** scan (``unroll=True``) over chunks of ``--chunk`` steps;
- **8 seeds** in one ``jax.vmap``-ed loop vs 8 sequential runs, both with the trainer's loop.

Compile time is excluded from the step times (one warm-up call, reported separately); each figure
is the best of ``--repeats`` runs. By default the clock is the process's CPU time, which stays
meaningful on a shared, loaded machine where wall-clock time mostly measures the other processes;
use ``--clock wall`` on a dedicated machine or an accelerator. Prints a markdown table of the
ratios, the basis of ``jaxstale.train.AUTO_STRATEGY``:

    python benchmarks/loop_strategies.py            # ~3 minutes on 2 idle CPU cores
    python benchmarks/loop_strategies.py --input 28 # 28x28x1 inputs instead of 8x8x1
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.runs import markdown_table
from jaxstale import models, train

DEFAULT_STEPS = {"mlp": 32, "cnn": 16, "resnet20": 8}


def _setup(name: str, input_size: int, batch: int, steps: int, seeds: int):
    shape = (input_size, input_size, 1)
    rng = np.random.default_rng(0)
    x = rng.random((seeds, steps, batch, *shape), dtype=np.float32)
    y = rng.integers(0, 10, (seeds, steps, batch)).astype(np.int32)
    funcs = [
        models.functional(models.create(name, input_shape=shape, num_classes=10, seed=s))
        for s in range(seeds)
    ]
    tx = optax.sgd(0.01, momentum=0.9)
    update = train._make_update(funcs[0].apply, tx, train.cross_entropy, None)
    carries = [(f.params, tx.init(f.params), f.state, jnp.asarray(True)) for f in funcs]
    return update, carries, jnp.asarray(x), jnp.asarray(y)


def _fresh(carry):
    return jax.tree.map(lambda a: jnp.array(a, copy=True), carry)


def _clock(kind: str):
    return time.process_time if kind == "cpu" else time.perf_counter


def _best(run, repeats: int, clock: str = "cpu") -> tuple[float, float]:
    """(best steady-state seconds, first call seconds = compile + one run) on ``clock``."""
    now = _clock(clock)
    t = now()
    run()  # compile + warm-up
    first = now() - t
    times = []
    for _ in range(repeats):
        t = now()
        run()
        times.append(now() - t)
    return min(times), first


def bench_model(name: str, args: argparse.Namespace) -> dict[str, float | str]:
    steps = args.steps or DEFAULT_STEPS[name]
    chunk, s = args.chunk, args.seeds
    steps = max(chunk, steps - steps % chunk)
    update, carries, x, y = _setup(name, args.input, args.batch, steps, s)
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *carries)
    single = {
        loop: train._compiled_loops(update, loop, vmap=False)(n)
        for loop, n in (("host", 1), ("scan", steps), ("unrolled", chunk))
    }
    vmapped = {
        loop: train._compiled_loops(update, loop, vmap=True)(n)
        for loop, n in (("host", 1), ("scan", steps), ("unrolled", chunk))
    }

    def run(loop: str, vmap: bool, seed: int = 0) -> None:
        fn = (vmapped if vmap else single)[loop]
        c = _fresh(stacked if vmap else carries[seed])
        xs, ys = (x, y) if vmap else (x[seed], y[seed])
        at = (lambda a, i, j: a[:, i:j]) if vmap else (lambda a, i, j: a[i:j])
        if loop == "host":
            for t in range(steps):
                c, _ = fn(c, xs[:, t] if vmap else xs[t], ys[:, t] if vmap else ys[t])
        else:
            size = steps if loop == "scan" else chunk
            for a in range(0, steps, size):
                c, _ = fn(c, at(xs, a, a + size), at(ys, a, a + size))
        jax.block_until_ready(c)

    r = args.repeats
    out: dict[str, float | str] = {"steps": steps}
    for loop in ("host", "scan", "unrolled"):
        best, first = _best(lambda loop=loop: run(loop, False), r, args.clock)
        out[f"{loop}_ms"] = 1e3 * best / steps
        out[f"{loop}_compile_s"] = first - best
    loop = train.default_strategy(name)[0]  # seeds are compared under the trainer's loop
    out["seed_loop"] = loop
    best, _ = _best(lambda: [run(loop, False, seed) for seed in range(s)], r, args.clock)
    out["seq_ms"] = 1e3 * best / steps
    best, first = _best(lambda: run(loop, True), r, args.clock)
    out["vmap_ms"] = 1e3 * best / steps
    out["vmap_compile_s"] = first - best
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(models.MODELS))
    p.add_argument("--input", type=int, default=8, help="input height/width (8: digits)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument(
        "--steps", type=int, default=None, help="steps per timed run (default per model)"
    )
    p.add_argument("--chunk", type=int, default=8, help="steps per unrolled scan chunk")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: process CPU time (robust on a shared, loaded machine; the default); wall: "
        "wall-clock (use on a dedicated machine or a GPU, where CPU time misses device work)",
    )
    args = p.parse_args(argv)
    start = time.perf_counter()
    rows, raw = [], []
    for name in args.models:
        m = bench_model(name, args)
        host = float(m["host_ms"])
        rows.append(
            [
                name,
                f"{host:.2f}",
                f"{host / float(m['scan_ms']):.2f}x",
                f"{host / float(m['unrolled_ms']):.2f}x",
                f"{float(m['seq_ms']) / float(m['vmap_ms']):.2f}x ({m['seed_loop']})",
                "/".join(train.default_strategy(name)),
            ]
        )
        raw.append(
            [name, m["steps"]]
            + [
                f"{float(m[k]):.2f}"
                for k in ("host_ms", "scan_ms", "unrolled_ms", "seq_ms", "vmap_ms")
            ]
            + [
                f"{float(m[k]):.1f}"
                for k in (
                    "host_compile_s",
                    "scan_compile_s",
                    "unrolled_compile_s",
                    "vmap_compile_s",
                )
            ]
        )
    cpu = platform.processor() or platform.machine()
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"\n## Loop strategies: {jax.default_backend()} ({cpu}, {os.cpu_count()} cores{load}), "
        f"{args.input}x{args.input}x1 inputs, batch {args.batch}, unroll chunk {args.chunk}, "
        f"{args.seeds} seeds; best of {args.repeats}, {args.clock} time\n"
    )
    print(
        "Speed-up over a host loop of jitted steps (>1 = faster), and of one vmap over "
        f"{args.seeds} sequential runs (both with the trainer's auto loop):\n"
    )
    print(
        markdown_table(
            [
                "model",
                "host ms/step",
                "rolled scan",
                "unrolled scan",
                f"vmap {args.seeds} seeds",
                "trainer auto",
            ],
            rows,
        )
    )
    print(f"\nRaw ms per step (sequential/vmap: all {args.seeds} seeds) and compile seconds:\n")
    print(
        markdown_table(
            [
                "model",
                "steps",
                "host",
                "scan",
                "unrolled",
                "sequential",
                "vmap",
                "compile host",
                "compile scan",
                "compile unrolled",
                "compile vmap",
            ],
            raw,
        )
    )
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
