"""Tokens per second of the GPT presets' synchronous training step (issue 23).

For each preset (``jaxstale.models.gpt.PRESETS``) at the embedded corpus's context (64) and
vocabulary (83): one jitted, donated step of next-token cross-entropy with the language-model
AdamW (``jaxstale.optimizers.adamw``: β2 0.95, decay on matrices, clipping), batch ``B``
windows. Timings are interleaved across presets (every round times each once, in a rotating
order) and the table gives the median step time, tokens per second ``B·T / step``, the model
FLOPs per token (``6N + 12·L·H·Q·T``, :func:`jaxstale.flops.gpt_flops_per_token`: the count MFU
is defined by), the FLOP/s achieved at that count and the MFU where the device's peak is known
(:data:`jaxstale.flops.PEAK_FLOPS`; a CPU's is not), and XLA's flop count of the compiled step
for comparison — not a model-FLOPs figure: it counts every HLO op as compiled (the softmax,
norms and optimizer too: ≈ 1.2 × 6N on the CPU), and on a GPU the cuBLAS / cuDNN custom calls
not at all (the H200 run's gpu preset: 24.9 M per token against a model count of 0.5 G). The
float32 step's peak is TF32's on an NVIDIA GPU (XLA's default matmul precision there). ``gpu`` is
listed with its parameter count and step flops but not run (``--run-gpu`` runs it too: on a CPU
a step takes seconds). The run also reports the ratio of the cpu preset's step to the tiny one's
measured in the same rounds.

Run: ``python benchmarks/gpt_throughput.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/<name>.py` (make bench)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._timing import interleaved
from jaxstale import flops, losses, models, optimizers
from jaxstale.models.gpt import PRESETS, gpt_param_count

CONTEXT, VOCAB = 64, 83


def build(preset: str, batch: int) -> dict[str, Any]:
    """The preset's compiled step and its carry: ``{"step", "carry", "x", "y", "params",
    "compile_s", "flops"}``."""
    model = models.create(f"gpt-{preset}", input_shape=(CONTEXT,), num_classes=VOCAB, seed=0)
    fn = models.functional(model)
    tx = optimizers.adamw(1e-3, 1000, warmup_steps=10)

    def step(params, opt, x, y):
        def loss(p):
            return losses.cross_entropy(fn.apply(p, fn.state, x, True)[0], y)

        value, grads = jax.value_and_grad(loss)(params)
        upd, opt = tx.update(grads, opt, params)
        return jax.tree.map(lambda p, u: p + u, params, upd), opt, value

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, VOCAB, (batch, CONTEXT)), jnp.int32)
    y = jnp.asarray(rng.integers(0, VOCAB, (batch, CONTEXT)), jnp.int32)
    params = jax.tree.map(jnp.array, fn.params)
    carry = (params, tx.init(params))
    t0 = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(*carry, x, y).compile()
    compile_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    n = int(sum(np.size(p) for p in jax.tree.leaves(fn.params)))
    return {"step": compiled, "carry": carry, "x": x, "y": y, "params": n,
            "compile_s": compile_s, "flops": float((cost or {}).get("flops", 0.0))}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per preset per round")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 steps")
    parser.add_argument("--run-gpu", action="store_true", help="time the gpu preset too")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 2, 2
    t_start = time.perf_counter()
    # the presets sized by the data (gpt2-small has its own context and vocabulary: GPU runs,
    # benchmarks/gpu_check.sh)
    sized = {p: kw for p, kw in PRESETS.items() if "context" not in kw}
    timed = [p for p in sized if p != "gpu" or args.run_gpu]
    runs = {p: build(p, args.batch_size) for p in timed}
    for r in runs.values():  # the first call, outside the timings
        *carry, loss = r["step"](*r["carry"], r["x"], r["y"])
        jax.block_until_ready(loss)
        r["carry"] = tuple(carry)
    times = interleaved(runs, args.rounds, args.steps)
    tokens = args.batch_size * CONTEXT
    kind = jax.devices()[0].device_kind
    precision = "tf32" if jax.default_backend() == "gpu" else "float32"
    rows = []
    for p, kw in sized.items():
        n = gpt_param_count(CONTEXT, VOCAB, layers=kw["layers"], width=kw["width"])
        model_flops = flops.gpt_flops_per_token(
            layers=kw["layers"], width=kw["width"], heads=kw["heads"], context=CONTEXT, vocab=VOCAB
        )
        row = {"preset": p, **kw, "params": n, "model_flops_per_token": model_flops}
        if p in runs:
            ms = 1e3 * statistics.median(times[p])
            tps = tokens / (ms / 1e3)
            row |= {"compile_s": round(runs[p]["compile_s"], 1), "step_ms": round(ms, 1),
                    "tokens_per_s": round(tokens / (ms / 1e3)),
                    "flops_per_token": round(runs[p]["flops"] / tokens),
                    "achieved_gflops": round(tps * model_flops / 1e9, 2),
                    "mfu": flops.mfu(tps, model_flops, kind, precision)}  # fmt: skip
        rows.append(row)
    ratio = (
        statistics.median(c / t for c, t in zip(times["cpu"], times["tiny"], strict=True))
        if {"cpu", "tiny"} <= set(times)
        else None
    )
    lines = [
        f"GPT presets, synchronous AdamW step: batch {args.batch_size} × context {CONTEXT} "
        f"({tokens} tokens), vocabulary {VOCAB}, {jax.default_backend()}, jitted + donated; "
        f"{args.rounds} interleaved rounds × {args.steps} steps.",
        "",
        "| preset | blocks × width | parameters | compile (s) | step ms (median) | tokens/s | "
        "model FLOPs / token (6N + attention) | GFLOP/s at that count | MFU | "
        "XLA's flops / token (for comparison) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [str(r.get(k, "not run")) for k in ("compile_s", "step_ms", "tokens_per_s")]
        got = r.get("achieved_gflops", "not run")
        m = r.get("mfu")
        util = (
            "not run" if "step_ms" not in r else ("– (peak unknown)" if m is None else f"{m:.1%}")
        )
        lines.append(
            f"| {r['preset']} | {r['layers']} × {r['width']} | {r['params']:,} | "
            f"{' | '.join(cells)} | {r['model_flops_per_token']:,} | {got} | {util} | "
            f"{r.get('flops_per_token', 'not run')} |"
        )
    if ratio is not None:
        lines += ["", f"cpu step / tiny step, same rounds (median): {ratio:.2f}."]
    lines += ["", f"Total wall time {time.perf_counter() - t_start:.0f} s."]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpt_throughput.md").write_text(table + "\n")
    return {"rows": rows, "ratio": ratio, "table": table}


if __name__ == "__main__":
    main()
