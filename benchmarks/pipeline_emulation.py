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

A GPT preset (``--model gpt-cpu``, issue 23) runs on token windows of the embedded corpus's
context (64) and vocabulary (83) with the language-model AdamW (``jaxstale.optimizers.adamw``)
on both sides (``--optimizer adamw``; SGD momentum otherwise); the table then gives tokens per
second, and every policy's compile time (``lower().compile()`` of its round, the target for an
``N = 16`` program being ≤ 60 s on 2 cores). A round whose ticks repeat a shorter pattern (2BW:
``2N`` ticks, ``N`` micro-batches per stage) runs as a loop over its chunks; ``--unrolled`` also
times it unrolled (its compile time grows like ``N²``). A schedule that splits the mini-batch
into ``M`` micro-batches (GPipe's ``sync``, 2BW) does smaller passes than the unsplit step: its
second ratio is to the unsplit step over the same ``M`` micro-batches, gradients accumulated,
which separates the cost of micro-batching from the emulator's.

Run: ``python benchmarks/pipeline_emulation.py [--model cnn] [--stages 4] [--batch 128]``;
``python benchmarks/pipeline_emulation.py --model gpt-deep --stages 16 --batch 16``; GPT-2 small
in bfloat16 at a GPU's batch (``benchmarks/gpu_check.sh``): ``--model gpt2-small --context 1024
--vocab 50304 --precision bfloat16 --batch 8 --stages 8`` (an MFU column where the device's peak
is known, :mod:`jaxstale.flops`).
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

from jaxstale import models, optimizers, pipeline, schedules
from jaxstale.losses import cross_entropy
from jaxstale.pipeline import emulator

#: a GPT's token windows: the embedded corpus's context and vocabulary
CONTEXT, VOCAB = 64, 83


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
    ap.add_argument("--backward", choices=("both", "saved"), default="both",
                    help="saved: skip the backward=recompute variants")  # fmt: skip
    ap.add_argument("--unrolled", action="store_true",
                    help="also time looping rounds unrolled")  # fmt: skip
    ap.add_argument("--context", type=int, default=CONTEXT, help="a GPT's window (ids)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="a GPT's vocabulary")
    ap.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                    help="a GPT's compute precision (bf16: f32 weights, optimizer)")  # fmt: skip
    ap.add_argument("--optimizer", choices=("sgd", "adamw"), default=None,
                    help="both sides' optimizer (default: adamw for a GPT, else sgd)")  # fmt: skip
    args = ap.parse_args(argv)

    n, bs, hw = args.stages, args.batch, args.size
    gpt = args.model.startswith("gpt")
    nb = 2 * n + 2 + args.rounds
    rng = np.random.default_rng(0)
    t, v = args.context, args.vocab
    if gpt:  # token windows: [B, T] ids, next-token targets
        kw = {"dtype": args.precision} if args.precision != "float32" else {}
        model = models.create(args.model, input_shape=(t,), num_classes=v, seed=0, **kw)
        xb = jnp.asarray(rng.integers(0, v, size=(nb, bs, t)).astype(np.int32))
        yb = jnp.asarray(rng.integers(0, v, size=(nb, bs, t)).astype(np.int32))
        shape = f"context {t}, vocabulary {v}, {args.precision}"
    else:
        kw = {"hidden": (256,) * 7} if args.model == "mlp" else {}
        model = models.create(args.model, input_shape=(hw, hw, 1), num_classes=10, seed=0, **kw)
        xb = jnp.asarray(rng.uniform(size=(nb, bs, hw, hw, 1)).astype(np.float32))
        yb = jnp.asarray(rng.integers(0, 10, size=(nb, bs)).astype(np.int32))
        shape = f"input {hw}x{hw}x1"
    opt_name = args.optimizer or ("adamw" if gpt else "sgd")
    tx = (
        optimizers.adamw(1e-3, 1000, warmup_steps=10)
        if opt_name == "adamw"
        else optax.sgd(0.05, momentum=0.9)
    )

    # the plain synchronous step of the unsplit model
    f = models.functional(model)

    def loss_grad(p, st, x, y):
        """``((loss, new model state), gradient)`` of the unsplit model on one batch."""

        def loss(p):
            out, nst = f.apply(p, st, x, True)
            return cross_entropy(out, y), nst

        return jax.value_and_grad(loss, has_aux=True)(p)

    def sync_step(p, o, st, x, y):
        (lv, nst), g = loss_grad(p, st, x, y)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, nst, lv

    def fresh_state() -> list:
        sp = jax.tree.map(jnp.array, f.params)
        return [sp, tx.init(sp), jax.tree.map(jnp.array, f.state)]

    def run_steps(step, state: list) -> None:
        """``args.rounds`` steps of a jitted synchronous ``step``, ``state`` updated in place."""
        for i in range(args.rounds):
            p, o, st, lv = step(*state, xb[i], yb[i])
            state[:] = [p, o, st]
        jax.block_until_ready(lv)

    sync = jax.jit(sync_step, donate_argnums=(0, 1, 2))
    sync_state = fresh_state()
    run_sync = lambda: run_steps(sync, sync_state)
    run_sync()  # compile
    sync_mem = sync.lower(*sync_state, xb[0], yb[0]).compile().memory_analysis()
    sync_carry = _bytes(sync_state)

    def micro_step(m: int):
        """The same synchronous step over ``m`` micro-batches of the mini-batch, their
        gradients accumulated (unrolled, as the emulator unrolls a tick's passes): the
        arithmetic of a schedule that splits the mini-batch (GPipe, 2BW), without a pipeline."""

        def step(p, o, st, x, y):
            xs, ys = x.reshape(m, bs // m, *x.shape[1:]), y.reshape(m, bs // m, *y.shape[1:])
            acc, lsum = None, 0.0
            for i in range(m):
                (lv, st), g = loss_grad(p, st, xs[i], ys[i])
                acc = g if acc is None else jax.tree.map(jnp.add, acc, g)
                lsum = lsum + lv
            u, o = tx.update(jax.tree.map(lambda a: a / m, acc), o, p)
            return optax.apply_updates(p, u), o, st, lsum / m

        return jax.jit(step, donate_argnums=(0, 1, 2))

    stages = models.functional_stages(model, n)
    sched = schedules.one_f_one_b(n, nb)
    rows = []
    ems: dict = {}
    compile_s: dict[str, float] = {}
    num_micro: dict[str, int] = {}
    for policy in args.policies.split(","):
        for backward, loop_ticks in (("saved", None), ("saved", False), ("recompute", None)):
            pol = pipeline.get_policy(policy)
            if backward == "recompute" and (pol.stash or pol.flush or args.backward == "saved"):
                continue  # the same computation either way (or not asked for)
            prog = pipeline.compile(sched, policy, backward=backward)
            em = emulator.PipelineEmulator(stages, prog, tx, momentum=0.9, loop_ticks=loop_ticks)
            if loop_ticks is False and (not args.unrolled or em.sub_period == prog.period):
                continue  # unrolled already (or not asked for)
            carry = em.init(xb[0])
            tables = {k: jnp.asarray(v) for k, v in prog.tables.items()}
            t0 = time.perf_counter()
            compiled = em.step.lower(carry, jnp.int32(0), tables, xb, yb).compile()
            label = policy if backward == "saved" else f"{policy} (backward=recompute)"
            if em.looped:
                label += f" (looped: {prog.period // em.sub_period} chunks)"
            elif loop_ticks is False:
                label += " (unrolled)"
            compile_s[label] = time.perf_counter() - t0
            mem = compiled.memory_analysis()  # em.memory_analysis's, without a second compile
            ems[label] = [compiled, carry, mem, tables, prog.num_rounds]
            num_micro[label] = prog.schedule.num_micro
    # the unsplit step over each policy's micro-batches (where a schedule splits the mini-batch)
    micro = sorted({m for m in num_micro.values() if m > 1 and bs % m == 0})
    micro_steps = {m: micro_step(m) for m in micro}
    micro_state = {m: fresh_state() for m in micro}
    run_micro = lambda m: run_steps(micro_steps[m], micro_state[m])
    for m in micro:
        run_micro(m)  # compile
    # steady-state rounds: after warm-up, before cool-down
    first = {p: ems[p][4] // 2 - args.rounds // 2 for p in ems}
    for p in ems:  # compile + warm
        step, carry, _, tables, _ = ems[p]
        carry, out = step(carry, jnp.int32(first[p]), tables, xb, yb)
        jax.block_until_ready(out)
        ems[p][1] = carry

    def run_policy(p):
        step, carry, _, tables, _ = ems[p]
        for i in range(args.rounds):
            carry, out = step(carry, jnp.int32(first[p] + i), tables, xb, yb)
        jax.block_until_ready(out)
        ems[p][1] = carry

    # interleave sync and emulator timings so machine load affects both alike
    t_sync, t_pol, t_micro = [], {p: [] for p in ems}, {m: [] for m in micro}
    for _ in range(args.reps):
        t_sync.append(_time(run_sync, 1) / args.rounds)
        for m in micro:
            t_micro[m].append(_time(lambda m=m: run_micro(m), 1) / args.rounds)
        for p in ems:
            t_pol[p].append(_time(lambda p=p: run_policy(p), 1) / args.rounds)
    ts = float(np.median(t_sync))
    tokens = bs * t if gpt else bs
    unit = "tokens" if gpt else "examples"
    util = lambda sec: "–"  # MFU: a GPT on a device of known peak
    if gpt:
        from jaxstale import flops
        from jaxstale.models.gpt import preset_of

        size = preset_of(args.model) or {}
        fpt = flops.gpt_flops_per_token(
            layers=len(model.blocks), width=size["width"], heads=size["heads"],
            context=t, vocab=size.get("vocab", v),
        )  # fmt: skip
        gpu_f32 = jax.default_backend() == "gpu" and args.precision == "float32"
        prec = "tf32" if gpu_f32 else args.precision
        kind = jax.devices()[0].device_kind

        def util(sec: float) -> str:
            m = flops.mfu(tokens / sec, fpt, kind, prec)
            return "–" if m is None else f"{m:.1%}"

    lines = [
        f"Model {args.model} ({models.param_count(model):,} params), {shape}, batch {bs}, "
        f"{opt_name}, N={n} stages, async 1F1B (sync: GPipe), backend {jax.default_backend()}; "
        f"median of {args.reps} x {args.rounds} steady-state rounds.",
        "",
        f"| policy | ms / step | {unit} / s | MFU | vs sync step | vs sync step, same "
        "micro-batches | carried state (MB) | XLA temp (MB) | compile (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| plain sync step (unsplit) | {ts * 1e3:.2f} | {tokens / ts:,.0f} | {util(ts)} | 1.00x "
        f"| – | {sync_carry / 2**20:.2f} | {sync_mem.temp_size_in_bytes / 2**20:.2f} | – |",
    ]
    tm = {m: float(np.median(t_micro[m])) for m in micro}
    for m in micro:
        lines.append(
            f"| plain sync step, {m} micro-batches accumulated | {tm[m] * 1e3:.2f} | "
            f"{tokens / tm[m]:,.0f} | {util(tm[m])} | {tm[m] / ts:.2f}x | 1.00x | – | – | – |"
        )
    for p in ems:
        tp = float(np.median(t_pol[p]))
        _, carry, mem, _, _ = ems[p]
        rows.append((p, tp / ts))
        same = f"{tp / tm[num_micro[p]]:.2f}x" if num_micro[p] in tm else "–"
        lines.append(
            f"| {p} | {tp * 1e3:.2f} | {tokens / tp:,.0f} | {util(tp)} | {tp / ts:.2f}x | {same} | "
            f"{_bytes(carry) / 2**20:.2f} | {mem.temp_size_in_bytes / 2**20:.2f} | "
            f"{compile_s[p]:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
