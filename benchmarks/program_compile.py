"""Host-side cost of compiling a long pipeline run: the program compiler's replay in arrays
against the replay one event at a time it replaced (``tests/pipeline/program_reference.py``).

``jaxstale.pipeline.compile`` replays the masked round program on the host to check it against
the schedule and to read every pass's stash look-back; the executors' per-tick view
(``Program.tick_table``) is built the same way. At 27,000 mini-batches of 2BW (N = 8, 8
micro-batches: 3.5 million events) the per-event replay took about a minute before the first
round ran. For each schedule the table gives the seconds of building the schedule itself
(``jaxstale.schedules``, unchanged), of each replay and of each tick table, measured once each
in one run, and the speed-ups (per-event / arrays). Both replays give the same look-backs,
capacities and tables (asserted here and in ``tests/pipeline/test_program.py``). The per-event
reference keeps only what computes the program (the compiler also checked every op's order,
dependencies and version one event at a time, now in arrays too): its times, and so the
speed-ups, are lower bounds of what the compiler cost before.

``--xla`` adds what a user waits on before a pipeline's first round (issue 54's "compile time
flat in depth"): XLA's compile of the emulator's round of ``gpt-deep`` (16 blocks of width 64,
the same model at every depth) under 1F1B with vanilla weights and AdamW, at N = 2, 4, 8 and 16
stages, lowered from abstract shapes (micro-batch 16 × 64), each compiled once in one run, with
the round's HLO instruction count; the target is N = 16 in at most 1.5× N = 2's seconds.

Run: ``python benchmarks/program_compile.py [--quick] [--xla] [--batches 3000] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/<name>.py` (make bench)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks._results import write as write_result
from experiments.runs import number
from jaxstale import pipeline, schedules
from jaxstale.pipeline.program import _Replay, _template
from tests.pipeline import program_reference as reference

#: (schedule, policy, micro-batches or None): 2BW splits each mini-batch into N micro-batches
CASES: tuple[tuple[str, str, bool], ...] = (
    ("1f1b", "stash", False),
    ("2bw", "vanilla", True),
    ("gpipe", "sync", True),
)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)``."""
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def row(name: str, policy: str, micro: bool, n: int, nb: int) -> dict[str, Any]:
    """One schedule: the seconds of each step and the speed-ups; asserts the two replays
    agree."""
    kw = {"num_micro": n} if micro else {}
    sched, t_sched = timed(lambda: schedules.get(name, num_stages=n, num_batches=nb, **kw))
    ticks, dmin, dmax = _template(sched)
    rep, t_new = timed(lambda: _Replay(sched, ticks, dmin, dmax))
    (_, look, *caps), t_old = timed(lambda: reference.replay(sched, ticks, dmin, dmax))
    prog = pipeline.compile(sched, policy)
    looks, t_look = timed(lambda: reference.look_table(prog, look))  # the old compile's loop
    assert [rep.in_cap, rep.ct_cap, rep.res_cap] == caps and np.array_equal(rep.look, looks)
    new_table, t_tab_new = timed(prog.tick_table)
    old_table, t_tab_old = timed(lambda: reference.tick_table(prog))
    assert all(np.array_equal(new_table[k], old_table[k]) for k in old_table)
    return {
        "schedule": name,
        "policy": policy,
        "events": int(prog.tables["valid"].size),
        "schedule_s": t_sched,
        "replay_old_s": t_old + t_look,
        "replay_new_s": t_new,
        "table_old_s": t_tab_old,
        "table_new_s": t_tab_new,
    }


def table(rows: list[dict[str, Any]], n: int, nb: int) -> str:
    """The markdown table of ``rows``."""
    head = (
        f"### Compiling a pipeline program on the host (N = {n}, {nb:,} mini-batches)\n\n"
        "| schedule | policy | events | build schedule (s) | replay per event (s) | "
        "replay in arrays (s) | speed-up | tick table per op (s) | in arrays (s) | speed-up |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"| {r['schedule']} | {r['policy']} | {r['events']:,} | {r['schedule_s']:.2f} | "
        f"{r['replay_old_s']:.2f} | {r['replay_new_s']:.3f} | "
        f"{r['replay_old_s'] / r['replay_new_s']:.0f}x | {r['table_old_s']:.2f} | "
        f"{r['table_new_s']:.3f} | {r['table_old_s'] / r['table_new_s']:.0f}x |"
        for r in rows
    ]
    return "\n".join([head, *lines])


#: the depths of ``--xla``'s rounds
DEPTHS = (2, 4, 8, 16)


def round_compile(
    n: int, mb: int = 16, t: int = 64, preset: str = "gpt-deep", equal_slots: bool = False
) -> dict[str, Any]:
    """XLA's compile of the emulator's 1F1B vanilla round of ``preset`` at ``n`` stages:
    ``{"stages", "blocks", "lower_s", "compile_s", "instructions"}`` (lowered from abstract
    shapes: nothing is allocated). ``equal_slots``: every stage's slot buffers (inputs,
    cotangents, residuals) given the deepest stage's count, ``N`` — above the memory floor
    (1F1B needs ``N − k`` at stage ``k``), a probe of what one slot shape for every stage
    saves XLA, not a layout to run."""
    import jax
    import jax.numpy as jnp

    from jaxstale import models, optimizers
    from jaxstale.pipeline import emulator

    model = models.create(preset, input_shape=(t,), num_classes=83, seed=0)
    stages = models.functional_stages(model, n)
    nb = 2 * n + 2
    prog = pipeline.compile(schedules.one_f_one_b(n, nb), "vanilla")
    if equal_slots:
        top = max(*prog.res_cap, *prog.in_cap, *prog.ct_cap)
        prog = prog._replace(res_cap=(top,) * n, in_cap=(top,) * n, ct_cap=(top,) * n)
    em = emulator.PipelineEmulator(stages, prog, optimizers.adamw(1e-3, 1000, warmup_steps=10))
    carry = jax.eval_shape(em.init, jax.ShapeDtypeStruct((mb, t), jnp.int32))
    tables = {k: jnp.asarray(v) for k, v in prog.tables.items()}
    data = jax.ShapeDtypeStruct((nb, mb, t), jnp.int32)
    lowered, t_lower = timed(lambda: em.step.lower(carry, jnp.int32(0), tables, data, data))
    compiled, t_compile = timed(lowered.compile)
    text = compiled.as_text()
    return {
        "preset": preset,
        "stages": n,
        "blocks": len(model.blocks),
        "lower_s": t_lower,
        "compile_s": t_compile,
        "instructions": sum(1 for line in text.splitlines() if " = " in line),
        "equal_slots": equal_slots,
    }


def xla_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`round_compile`'s rows (the floor layout, and where they
    were measured the equal-slot probe beside it), with each depth's ratio to the first's."""
    base = [r for r in rows if not r.get("equal_slots")]
    probe = {r["stages"]: r for r in rows if r.get("equal_slots")}
    first = base[0]["compile_s"]
    extra = f" | compile, one slot shape (s) | / N = {base[0]['stages']}" if probe else ""
    head = (
        f"### XLA's compile of the emulator's round ({base[0]['preset']}, {base[0]['blocks']} "
        "blocks, 1F1B "
        "vanilla, AdamW)\n\n"
        "| stages N | trace + lower (s) | compile (s) | / N = "
        f"{base[0]['stages']} | HLO instructions{extra} |\n|---|---|---|---|---|"
        + ("---|---|" if probe else "")
    )
    p0 = probe[base[0]["stages"]]["compile_s"] if base[0]["stages"] in probe else None
    lines = []
    for r in base:
        line = (
            f"| {r['stages']} | {r['lower_s']:.1f} | {r['compile_s']:.1f} | "
            f"{r['compile_s'] / first:.2f}x | {r['instructions']:,} |"
        )
        if (q := probe.get(r["stages"])) is not None:
            ratio = f"{q['compile_s'] / p0:.2f}x" if p0 else "–"
            line += f" {q['compile_s']:.1f} | {ratio} |"
        lines.append(line)
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="200 mini-batches; writes no result")
    p.add_argument("--stages", type=number(int, low=1), default=8)
    p.add_argument("--batches", type=number(int, low=1), default=3000)
    p.add_argument("--xla", action="store_true", help="XLA's compile of rounds at N = 2 … 16")
    p.add_argument(
        "--equal-slots",
        action="store_true",
        help="with --xla: each round also with one slot shape for every stage (a probe)",
    )
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = p.parse_args(argv)
    nb = 200 if args.quick else args.batches
    rows = [row(name, pol, micro, args.stages, nb) for name, pol, micro in CASES]
    text = table(rows, args.stages, nb)
    xla: list[dict[str, Any]] = []
    if args.xla:
        depths = (1, 2) if args.quick else DEPTHS  # gpt-tiny has 2 blocks
        preset = "gpt-tiny" if args.quick else "gpt-deep"
        layouts = (False, True) if args.equal_slots else (False,)
        xla = [round_compile(n, preset=preset, equal_slots=e) for n in depths for e in layouts]
        text += "\n\n" + xla_table(xla)
    print(text)
    if not args.quick:
        write_result("program_compile", text, args.out)
    return {"rows": rows, "text": text, "xla": xla}


if __name__ == "__main__":
    main()
