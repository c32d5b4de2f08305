"""Cost of one emulated pipelined step per weight policy vs one plain synchronous step.

For each policy of :mod:`jaxstale.pipeline` this times one steady-state round of the pipeline
emulator (= one mini-batch through every stage: each stage's forward, its backward at the
policy's weights, the update) and one jitted, donated synchronous SGD step of the *unsplit*
model on the same mini-batch, in the same process, interleaved, and reports the ratio (target:
the default backward mode within 1.3x for every policy); vanilla and the prediction policies run
twice, with ``backward="saved"`` (the default: the forward's residuals are kept) and
``backward="recompute"`` (the stage forward is recomputed at the backward weights). Memory comes
from XLA's compiled memory analysis of the round
(``jitted.lower(...).compile().memory_analysis()``) plus the bytes of the carried state
(weights, optimizer state, stash, in-flight activation slots).

Run: ``python benchmarks/pipeline_emulation.py [--model cnn] [--stages 4] [--batch 128]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale import models, pipeline, schedules
from jaxstale.losses import cross_entropy
from jaxstale.pipeline import emulator


def _bytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def _time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn", choices=models.MODELS)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=28, help="input height = width (1 channel)")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions (median)")
    ap.add_argument("--rounds", type=int, default=4, help="steady-state rounds per repetition")
    ap.add_argument("--policies", default=",".join(pipeline.POLICIES))
    args = ap.parse_args(argv)

    n, bs, hw = args.stages, args.batch, args.size
    kw = {"hidden": (256,) * 7} if args.model == "mlp" else {}
    model = models.create(args.model, input_shape=(hw, hw, 1), num_classes=10, seed=0, **kw)
    nb = 2 * n + 2 + args.rounds
    rng = np.random.default_rng(0)
    xb = jnp.asarray(rng.uniform(size=(nb, bs, hw, hw, 1)).astype(np.float32))
    yb = jnp.asarray(rng.integers(0, 10, size=(nb, bs)).astype(np.int32))

    # the plain synchronous step of the unsplit model
    f = models.functional(model)
    tx = optax.sgd(0.05, momentum=0.9)

    def sync_step(p, o, st, x, y):
        def loss(p):
            out, nst = f.apply(p, st, x, True)
            return cross_entropy(out, y), nst

        (lv, nst), g = jax.value_and_grad(loss, has_aux=True)(p)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, nst, lv

    sync = jax.jit(sync_step, donate_argnums=(0, 1, 2))
    sp = jax.tree.map(jnp.array, f.params)
    sync_state = [sp, tx.init(sp), jax.tree.map(jnp.array, f.state)]

    def run_sync():
        for i in range(args.rounds):
            p, o, st, lv = sync(*sync_state, xb[i], yb[i])
            sync_state[:] = [p, o, st]
        jax.block_until_ready(lv)

    run_sync()  # compile
    sync_mem = sync.lower(*sync_state, xb[0], yb[0]).compile().memory_analysis()
    sync_carry = _bytes(sync_state)

    stages = models.functional_stages(model, n)
    sched = schedules.one_f_one_b(n, nb)
    rows = []
    ems = {}
    for policy in args.policies.split(","):
        for backward in ("saved", "recompute"):
            pol = pipeline.get_policy(policy)
            if backward == "recompute" and (pol.stash or pol.flush):
                continue  # the same computation either way
            prog = pipeline.compile(sched, policy, backward=backward)
            em = emulator.PipelineEmulator(stages, prog, tx, momentum=0.9)
            carry = em.init(xb[0])
            mem = em.memory_analysis(carry, xb, yb)
            tables = {k: jnp.asarray(v) for k, v in prog.tables.items()}
            label = policy if backward == "saved" else f"{policy} (backward=recompute)"
            ems[label] = [em, carry, mem, tables, prog.num_rounds]
    # steady-state rounds: after warm-up, before cool-down
    first = {p: ems[p][4] // 2 - args.rounds // 2 for p in ems}
    for p in ems:  # compile + warm
        em, carry, _, tables, _ = ems[p]
        carry, out = em.step(carry, jnp.int32(first[p]), tables, xb, yb)
        jax.block_until_ready(out)
        ems[p][1] = carry

    def run_policy(p):
        em, carry, _, tables, _ = ems[p]
        for i in range(args.rounds):
            carry, out = em.step(carry, jnp.int32(first[p] + i), tables, xb, yb)
        jax.block_until_ready(out)
        ems[p][1] = carry

    # interleave sync and emulator timings so machine load affects both alike
    t_sync, t_pol = [], {p: [] for p in ems}
    for _ in range(args.reps):
        t_sync.append(_time(run_sync, 1) / args.rounds)
        for p in ems:
            t_pol[p].append(_time(lambda p=p: run_policy(p), 1) / args.rounds)
    ts = float(np.median(t_sync))
    lines = [
        f"Model {args.model} ({models.param_count(model):,} params), input {hw}x{hw}x1, "
        f"batch {bs}, "
        f"N={n} stages, async 1F1B (sync: GPipe), backend {jax.default_backend()}; "
        f"median of {args.reps} x {args.rounds} steady-state rounds.",
        "",
        "| policy | ms / step | vs sync step | carried state (MB) | XLA temp (MB) |",
        "|---|---|---|---|---|",
        f"| plain sync step (unsplit) | {ts * 1e3:.2f} | 1.00x | {sync_carry / 2**20:.2f} | "
        f"{sync_mem.temp_size_in_bytes / 2**20:.2f} |",
    ]
    for p in ems:
        tp = float(np.median(t_pol[p]))
        em, carry, mem, _, _ = ems[p]
        rows.append((p, tp / ts))
        lines.append(
            f"| {p} | {tp * 1e3:.2f} | {tp / ts:.2f}x | {_bytes(carry) / 2**20:.2f} | "
            f"{mem.temp_size_in_bytes / 2**20:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
