"""Pipeline memory per stage of a GPT: the emulator's carried state against the formula, and
the GPU preset projected (issue 23).

An ``N``-stage asynchronous 1F1B pipeline (PipeDream) of a :mod:`jaxstale.models.gpt` preset —
``L`` pre-norm blocks of width ``D`` with ``H`` heads, the embedding in the first stage and the
head in the last — trained with the language-model AdamW, mini-batches of ``mb`` windows of
``T`` tokens, under ``vanilla`` (one weight copy per stage) and ``stash`` (PipeDream's ``N − k``
versions at stage ``k``), ``backward="saved"`` (the forward's residuals kept until its
backward, the emulator's default) and ``"recompute"``.

**Formula** per stage ``k`` with ``P_k`` parameters and ``L_k`` blocks (bytes, float32; ``L_k``
as :func:`jaxstale.models.split` cuts the model, :func:`stage_blocks`):

* weights ``V_k·4P_k`` (``V_k = N − k`` with stash, plus its 8-byte ring pointers; else 1);
* optimizer ``8P_k + 8``: AdamW's two moments and its two step counts;
* inputs (``k > 0``): ``(N − k + 1)·4·mb·T·D`` — the activations in flight, one slot more
  than PipeDream's ``N − k`` for the arriving one; cotangent (``k < N − 1``): ``4·mb·T·D``;
* residuals (``k < N − 1``, ``saved`` only: with ``recompute`` a stash's backward recomputes
  its forward at the stashed version, exactly; the loss stage fuses its forward and backward):
  ``(N − k)·R_k`` with ``R_k = L_k·R + 4·mb·T·[k = 0]`` (stage 0 also keeps the token ids),

  ``R = mb·T·(144·D + 13·H·T + 8·H + 32) + 8·D + 12``

  per block: what ``jax.vjp`` of the block keeps — twelve ``[mb, T, D]`` float32 arrays
  (``48·mb·T·D``), six ``[mb, T, 4D]`` of the GELU MLP (``96·mb·T·D``), three ``[mb, H, T, T]``
  attention arrays and the causal mask as bool (``13·mb·H·T²``), the softmax's and the two
  norms' per-row statistics (``8·mb·H·T + 32·mb·T``), the norms' scales and three scalars.

The attention term ``13·mb·H·T²`` is what grows with the context: at the GPU preset's
``T = 1024`` it is half of a block's residuals, and the residual slots dominate a stage's
memory; ``backward="recompute"`` keeps only the inputs.

**Under a rematerialisation policy** (``remat``, :mod:`jaxstale.models.remat`) a slot keeps, in
units of one activation ``4·mb·T·D`` (float32), for a stage of ``L_k`` blocks:

* ``"names"``: ``11·L_k − 1 + [k = 0]`` — per block the tagged ln1, qkv (3), residual after
  the attention, ln2 and MLP pre-activation (4): ten units, plus the residual stream between
  blocks (``L_k − 1``) and stage 0's embedding output; no ``T²`` term (the softmax is
  recomputed from q and k), less than PyTorch autograd's ≈ 15 units per block at T = 64;
* ``"dots"``: ``9·L_k − 1`` — the weight products' outputs (qkv, the attention's and the
  MLP's projections: eight units a block) and the stream between blocks;
* ``"full"``: nothing (the stage input is already held), as ``backward="recompute"``.

The **floor** of a policy is this formula: the weight versions it needs, the in-flight slots
(``N − k`` at stage ``k``, the 1F1B minimum) times the slot under the chosen remat, the
optimizer state; the carry equals it to the byte, and the tests hold it within 10 %.

Measured without allocating anything: the per-stage pytrees of the emulator's carry
(``jax.eval_shape`` of :meth:`~jaxstale.pipeline.emulator.PipelineEmulator.init`), equal to the
formula to the byte for every preset here (``tests/benchmarks/test_pipeline_memory_gpt.py``
checks it); with ``--xla``, ``compiled.memory_analysis()`` of the emulator's round (all stages
on one device: its arguments are the carry plus the data and tables, its temporaries one
round's working set).

Run: ``python benchmarks/pipeline_memory_gpt.py [--xla]``; results in
``benchmarks/results/pipeline_memory_gpt.md``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
from flax import nnx

from jaxstale import models, optimizers, pipeline, schedules
from jaxstale.models.gpt import PRESETS
from jaxstale.models.remat import REMAT, remat_stages
from jaxstale.pipeline import emulator
from jaxstale.sizes import tree_bytes

VOCAB = 83
#: (preset, N, mini-batch, context) measured; the GPU preset at the data's context
CASES = [("gpt-cpu", 8, 16, 64), ("gpt-cpu", 4, 16, 64), ("gpt-deep", 16, 16, 64)]
CASES += [("gpt-gpu", 12, 16, 64)]
#: the GPU preset at a GPU's context, by the formula only
PROJECTION = ("gpt-gpu", 12, 8, 1024)
MIB = 2**20


def block_residuals(mb: int, t: int, d: int, h: int) -> int:
    """``R``: the bytes a saved backward keeps per block and micro-batch."""
    return mb * t * (144 * d + 13 * h * t + 8 * h + 32) + 8 * d + 12


def slot_bytes(remat: str, blocks: int, first: bool, mb: int, t: int, d: int, h: int) -> int:
    """The bytes one in-flight slot of a non-loss stage of ``blocks`` blocks keeps under
    ``remat`` (``first``: stage 0, which holds the embedding); the module docstring's units."""
    act = 4 * mb * t * d
    if remat == "none":
        return blocks * block_residuals(mb, t, d, h) + (4 * mb * t if first else 0)
    if remat == "names":
        return (11 * blocks - 1 + int(first)) * act
    if remat == "dots":
        return (9 * blocks - 1) * act
    if remat == "full":
        return 0
    raise ValueError(f"remat must be one of none, names, dots, full, got {remat!r}")


def formula(
    preset: str, n: int, mb: int, t: int, *, stash: bool, saved: bool = True, remat: str = "none"
) -> list[dict[str, int]]:
    """Per stage, the formula's bytes: ``weights``, ``optimizer``, ``inputs``, ``residuals``
    (cotangent included), ``total``; ``saved=False`` is ``backward="recompute"``."""
    cfg = PRESETS[preset.removeprefix("gpt-")]
    d, h = cfg["width"], cfg["heads"]
    per = stage_blocks(preset, n, t)
    rows = []
    for k in range(n):
        p = per[k] * (12 * d * d + 13 * d)
        p += (VOCAB + t) * d if k == 0 else 0
        p += d * VOCAB + VOCAB + 2 * d if k == n - 1 else 0
        v = n - k if stash else 1
        act = 4 * mb * t * d
        inputs = (n - k + 1) * act if k > 0 else 0
        res = 0
        if k < n - 1:
            r = slot_bytes(remat, per[k], k == 0, mb, t, d, h)
            res = act + ((n - k) * r if saved else 0)
        row = {"params": p, "versions": v, "weights": v * 4 * p + (8 if stash else 0)}
        row |= {"optimizer": 8 * p + 8, "inputs": inputs, "residuals": res}
        row["total"] = row["weights"] + row["optimizer"] + inputs + res
        rows.append(row)
    return rows


@functools.cache
def _stages(preset: str, n: int, t: int) -> Any:
    """The preset's functional stages (seed 0), built once per case for all its variants."""
    model = models.create(preset, input_shape=(t,), num_classes=VOCAB, seed=0)
    return models.functional_stages(model, n)


@functools.cache
def stage_blocks(preset: str, n: int, t: int) -> tuple[int, ...]:
    """``L_k``: the blocks of each stage as :func:`jaxstale.models.split` cuts the preset (by
    parameter count: uneven where the embedding or head weighs in), read from an abstract model
    (nothing allocated)."""
    make = lambda: models.create(preset, input_shape=(t,), num_classes=VOCAB, seed=0)
    return tuple(len(s.blocks) for s in models.split(nnx.eval_shape(make), n))


def measure(
    preset: str,
    n: int,
    mb: int,
    t: int,
    policy: str,
    xla: bool = False,
    backward: str = "saved",
    remat: str = "none",
) -> dict:
    """The emulator's carried state per stage (abstract shapes) and, with ``xla``, XLA's
    memory analysis of its round."""
    stages = remat_stages(_stages(preset, n, t), remat)
    nb = 2 * n + 2
    prog = pipeline.compile(schedules.one_f_one_b(n, nb), policy, backward=backward)
    tx = optimizers.adamw(1e-3, 1000, warmup_steps=10)
    em = emulator.PipelineEmulator(stages, prog, tx)
    carry = jax.eval_shape(em.init, jax.ShapeDtypeStruct((mb, t), jnp.int32))
    rows = []
    for k in range(n):
        w, o = tree_bytes(carry["weights"][k]), tree_bytes(carry["opt"][k])
        inp = tree_bytes(carry["inp"][k])
        res = tree_bytes(carry["res"][k]) + tree_bytes(carry["ct"][k])
        rows.append({"weights": w, "optimizer": o, "inputs": inp, "residuals": res})
        rows[-1]["total"] = w + o + inp + res + tree_bytes((carry["acc"][k], carry["bn"][k]))
    out: dict[str, Any] = {"carried": rows}
    if xla:
        data = jax.ShapeDtypeStruct((nb, mb, t), jnp.int32)
        mem = em.memory_analysis(carry, data, data)
        out["xla"] = {
            "arguments": mem.argument_size_in_bytes,
            "temp": mem.temp_size_in_bytes,
            "data": 2 * tree_bytes(data) + tree_bytes(prog.tables),
        }
    return out


def _mib(b: float) -> str:
    return f"{b / MIB:,.2f}"


#: (policy, remat, backward) of the remat tables; the issue's targets (MiB) where it set one
VARIANTS = [(p, r, "saved") for p in ("vanilla", "stash") for r in REMAT]
VARIANTS += [("vanilla", "none", "recompute"), ("stash", "none", "recompute")]
TARGETS = {
    ("gpt-cpu", 8, "vanilla", "names", "saved"): 160.0,
    ("gpt-gpu", 12, "stash", "names", "saved"): 6.5e9 / MIB,
    ("gpt-gpu", 12, "stash", "none", "recompute"): 3.2e9 / MIB,
}


def remat_rows(
    preset: str, n: int, mb: int, t: int, variants: list[tuple[str, str, str]] | None = None
) -> list[dict[str, Any]]:
    """Each of ``variants`` (default :data:`VARIANTS`): its carried and formula totals (bytes)
    and its target."""
    rows = []
    for policy, remat, backward in VARIANTS if variants is None else variants:
        got = measure(preset, n, mb, t, policy, backward=backward, remat=remat)["carried"]
        want = formula(
            preset, n, mb, t, stash=policy == "stash", saved=backward == "saved", remat=remat
        )
        rows.append(
            {
                "policy": policy,
                "remat": remat,
                "backward": backward,
                "carried": sum(r["total"] for r in got),
                "formula": sum(r["total"] for r in want),
                "target_mib": TARGETS.get((preset, n, policy, remat, backward)),
            }
        )
    return rows


def _remat_table(preset: str, n: int, mb: int, t: int) -> str:
    lines = [
        f"{preset}, N = {n}, {mb} × {t} tokens: every policy under every remat (MiB, all stages)",
        "",
        "| policy | remat | backward | carried | floor formula | carried / formula | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in remat_rows(preset, n, mb, t):
        target = r["target_mib"]
        met = target is not None and r["carried"] / MIB <= target
        mark = "" if target is None else f"≤ {target:,.0f}: {'met' if met else 'MISSED'}"
        lines.append(
            f"| {r['policy']} | {r['remat']} | {r['backward']} | {_mib(r['carried'])} | "
            f"{_mib(r['formula'])} | {r['carried'] / r['formula']:.3f} | {mark} |"
        )
    return "\n".join(lines)


def tables(xla: bool = False) -> str:
    """The measured cases against the formula, then the projection."""
    parts = []
    for preset, n, mb, t in CASES:
        cfg = PRESETS[preset.removeprefix("gpt-")]
        head = (
            f"**{preset}** ({cfg['layers']} blocks × {cfg['width']}, {cfg['heads']} heads), "
            f"N = {n}, mini-batch {mb} × {t} tokens, AdamW, backward saved (MiB; carried = the "
            "emulator's per-stage pytrees, formula = the module docstring's)"
        )
        cols = "| policy | stage | weights | optimizer | inputs | residuals + cotangent "
        lines = [head, "", cols + "| carried total | formula total | equal |", "|---" * 9 + "|"]
        notes = []
        for policy in ("vanilla", "stash"):
            got = measure(preset, n, mb, t, policy, xla=xla and preset != "gpt-gpu")
            want = formula(preset, n, mb, t, stash=policy == "stash")
            shown = sorted({0, 1, n // 2, n - 2, n - 1})
            for k in shown:
                g, f = got["carried"][k], want[k]
                lines.append(
                    f"| {policy} | {k} | {_mib(g['weights'])} | {_mib(g['optimizer'])} | "
                    f"{_mib(g['inputs'])} | {_mib(g['residuals'])} | {_mib(g['total'])} | "
                    f"{_mib(f['total'])} | {'yes' if g['total'] == f['total'] else 'NO'} |"
                )
            total = sum(r["total"] for r in got["carried"])
            same = all(g["total"] == f["total"] for g, f in zip(got["carried"], want, strict=True))
            note = f"| {policy} | all {n} | | | | | {_mib(total)} | "
            note += f"{_mib(sum(r['total'] for r in want))} | {'yes' if same else 'NO'} |"
            lines.append(note)
            if "xla" in got:
                x = got["xla"]
                notes.append(
                    f"{preset} N = {n} {policy}: XLA's analysis of the round: arguments "
                    f"{_mib(x['arguments'])} MiB (carry {_mib(total)} + data and tables "
                    f"{_mib(x['data'])}), temporaries {_mib(x['temp'])} MiB"
                )
        parts += ["\n".join(lines), *notes, _remat_table(preset, n, mb, t)]
    preset, n, mb, t = PROJECTION
    lines = [
        f"**Projection (formula only): {preset} (12 blocks × 768, 12 heads, 85 M parameters), "
        f"N = {n}, micro-batch {mb} × {t} tokens, AdamW (MiB per stage)**",
        "",
        "| policy | backward | stage 0 | stage 1 | stage 6 | stage 10 | stage 11 |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy, saved in (("vanilla", True), ("vanilla", False), ("stash", True), ("stash", False)):
        rows = formula(preset, n, mb, t, stash=policy == "stash", saved=saved)
        cells = " | ".join(_mib(rows[k]["total"]) for k in (0, 1, 6, 10, 11))
        lines.append(f"| {policy} | {'saved' if saved else 'recompute'} | {cells} |")
    cfg = PRESETS["gpu"]
    r = block_residuals(mb, t, cfg["width"], cfg["heads"])
    lines += [
        "",
        f"A block's residuals per micro-batch: {_mib(r)} MiB, of which the attention's "
        f"`13·mb·H·T²` is {_mib(13 * mb * cfg['heads'] * t * t)} MiB; stage 0 keeps "
        f"{n} micro-batches' worth for its one block.",
    ]
    parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xla", action="store_true", help="also compile the rounds (minutes)")
    args = ap.parse_args(argv)
    text = tables(xla=args.xla)
    print(text)
    return text


if __name__ == "__main__":
    main()
