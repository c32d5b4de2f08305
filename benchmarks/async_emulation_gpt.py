"""Cost of one emulated asynchronous update of a GPT vs the same method's synchronous step.

Issue 23's speed target for the asynchronous emulator: its update over a GPT step ≤ 1.2x for
every method. The same variants and timing as ``benchmarks/async_emulation.py`` (whose
:func:`~benchmarks.async_emulation.bench` this calls), on a GPT preset
(``jaxstale.models.gpt.PRESETS``) at the embedded corpus's context (64) and vocabulary (83),
batch 16 windows of random tokens, next-token cross-entropy: per method its synchronous step
(the chain at zero staleness, jitted and donated), the step with ``stale_params`` a separate
buffer it rewrites (what any real server reads and writes), the emulator's host-loop update
(``compiled_row_step``) and both in a ``lax.scan`` of ``--chunk`` updates — the scan is the
loop ``asyncdp`` runs a GPT with (no convolution: ``loop="auto"`` picks it). Process CPU-time
medians of interleaved rounds; ratios are the median of the per-round ratios with the
interquartile range in brackets.

Run: ``python benchmarks/async_emulation_gpt.py [--quick] [--preset cpu] [--out DIR]``; prints a
markdown table and, unless ``--quick``, writes it to ``<--out>/async_emulation_gpt.md``
(default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._results import write as write_result
from benchmarks.async_emulation import METHODS, _ratio, bench
from experiments.runs import markdown_table
from jaxstale import models

CONTEXT, VOCAB, BATCH = 64, 83, 16
TARGET = 1.2  # issue 23: emulated update / synchronous step


def gpt(preset: str, batch: int = BATCH) -> tuple[object, jax.Array, jax.Array]:
    """The preset's model (functional) and one random batch of windows and next tokens."""
    model = models.create(f"gpt-{preset}", input_shape=(CONTEXT,), num_classes=VOCAB, seed=0)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, VOCAB, (batch, CONTEXT)), jnp.int32)
    y = jnp.asarray(rng.integers(0, VOCAB, (batch, CONTEXT)), jnp.int32)
    return models.functional(model), x, y


def rows(raw: dict[str, np.ndarray], methods: tuple[str, ...]) -> list[list[str]]:
    """One table row per method: the medians (ms) and the ratios against the target."""
    ms = {k: float(np.median(v)) for k, v in raw.items()}
    out = []
    for method in methods:
        emu, sync = raw[f"{method} emulated"], raw[f"{method} sync"]
        scan, sync_scan = raw[f"{method} scan"], raw[f"{method} sync scan"]
        worst = max(np.median(emu / sync), np.median(scan / sync_scan))
        out.append(
            [
                method,
                f"{ms[f'{method} sync']:.1f}",
                f"{ms[f'{method} stale copy']:.1f}",
                f"{ms[f'{method} emulated']:.1f}",
                _ratio(emu, sync, bold=True),
                _ratio(emu, raw[f"{method} stale copy"]),
                f"{ms[f'{method} sync scan']:.1f}",
                f"{ms[f'{method} scan']:.1f}",
                _ratio(scan, sync_scan, bold=True),
                "yes" if worst <= TARGET else "no",
            ]
        )
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="gpt-tiny, few rounds (a smoke run)")
    p.add_argument("--preset", default=None, help="GPT preset (default cpu; --quick tiny)")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--calls", type=int, default=None, help="host calls per round")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds")
    p.add_argument("--chunk", type=int, default=None, help="updates per scan call")
    p.add_argument("--out", default=None, help="folder for the .md (not with --quick)")
    args = p.parse_args(argv)
    preset = args.preset or ("tiny" if args.quick else "cpu")
    calls = args.calls or (3 if args.quick else 10)
    reps = args.repeats or (2 if args.quick else 7)
    chunk = args.chunk or (4 if args.quick else 8)
    f, x, y = gpt(preset)
    n_params, raw = bench(f, x, y, args.workers, calls, reps, METHODS, chunk=chunk)
    head = ["method", "sync step ms", "stale copy ms", "emulated ms", "emulated / sync"]
    head += ["emulated / stale copy", "sync in scan ms/step", "emulated in scan ms/update"]
    head += ["scan: emulated / sync", f"both ≤ {TARGET}x"]
    text = "\n".join(
        [
            f"### One emulated async update of gpt-{preset} ({n_params:,} parameters, batch "
            f"{BATCH} × context {CONTEXT}, M = {args.workers} gamma-timed workers) vs the same "
            f"method's synchronous step ({jax.default_backend()}; CPU-time medians of {reps} "
            f"interleaved rounds × {calls} host calls, scans of {chunk} updates; ratios: median "
            "of the per-round ratios, interquartile range in brackets)\n",
            markdown_table(head, rows(raw, METHODS)),
        ]
    )
    print(text)
    if not args.quick:
        write_result("async_emulation_gpt", text, args.out)
    return text


if __name__ == "__main__":
    main()
