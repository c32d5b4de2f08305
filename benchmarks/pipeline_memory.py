"""Pipeline memory per stage and weight policy: carried state, XLA's analysis, the formula.

An ``N``-stage asynchronous 1F1B pipeline (PipeDream) of an MLP — input ``W`` features, 8
hidden layers of ``W`` (ReLU), 10 classes: 9 blocks, ``N = 8`` equal stages (the last also holds
the head) — under three weight policies:

* ``vanilla`` — one weight copy per stage;
* ``stash`` — PipeDream's weight stashing: stage ``k`` keeps ``V_k = N − k`` versions (the
  current one included);
* ``spectrain`` — SpecTrain / NAG prediction (``spectrain-v1``; ``nesterov`` has the same
  state): one weight copy plus the optimizer's last update ``Δw_last``.

Measured, from compiled executables and without allocating anything (abstract shapes):

* **carried state per stage** of the emulator (``jaxstale.pipeline.emulator``): the bytes of
  the per-stage pytrees it carries from round to round — weights or stash, optimizer state, and
  the slots of in-flight stage inputs, received cotangents and saved forward residuals;
* ``compiled.memory_analysis()`` of the **emulator's round** (one device: every stage) and of
  the **mesh executor's tick** (per device: one stage), arguments / outputs / aliased (donated)
  / temporaries.

**Formula** per stage ``k`` (bytes, fp32, micro-batch ``mb``; for 1F1B ``M = 1``, so ``mb`` is
the mini-batch):

``V_k·4P_k + opt_k + slots_k``, with ``P_k`` the stage's parameters, ``opt_k = 4P_k`` (SGD
momentum; prediction adds ``Δw_last``: ``+4P_k`` and a 4-byte count; a stash adds its 8-byte
ring pointers), and the activation slots of 1F1B (the program's capacities, checked against
these closed forms): ``N − k + 1`` inputs of ``4·mb·d_k`` (``k > 0``; the arriving activation
needs one slot more than PipeDream's ``N − k`` in flight), one received cotangent of
``4·mb·d_(k+1)`` and ``N − k`` saved-residual sets of ``R_k`` (``k < N − 1``; the loss stage
fuses its forward into its backward). For this MLP ``R_k`` is, per block of the stage,
``5·mb·d_out`` (a ReLU's mask, 1 byte, and one float32 array) plus ``4·mb·d_in`` for every block
but the stage's first (its input), plus ``4·mb·d_0`` on stage 0 (the flattened input). The
carried state matches this formula to the byte (``tests/benchmarks/test_studies.py``).

The **mesh executor** stacks every stage on a ``"stage"`` axis, so each device holds the
*largest* stage's shapes: per device ``4·P_max·(1 + C + o + 1) + 4·S·(2·A_max + R_max) +
8·A_max + ...`` — parameters, a stash ring of ``C = max_k V_k`` versions on *every* device (1
when not stashing: the current weights are then held twice, as parameters and as the ring's
newest slot), ``o`` optimizer copies, a gradient accumulator, ``S`` (the most slots any stage
needs) input / cotangent slots of ``A_max`` and residual slots of ``R_max`` floats (ReLU masks
stored as float32), and two inboxes; the data (all micro-batches) is an argument replicated on
every device. The tables name these overheads.

**Projection** to a 1B-parameter model in 8 equal stages (formula only, fp32 weights + SGD
momentum, activations excluded: they depend on the model and the micro-batch; the slot counts
above carry over): per stage ``P = 125M`` (0.5 GB a copy). PipeDream-2BW (two versions per
stage, Narayanan et al. 2021) is a formula-only row: ``2`` weight copies + momentum (plus a
gradient accumulator when it accumulates micro-batches; not counted).

Plot (``--plot PATH``; default ``<--out>/pipeline_memory.png`` or
``benchmarks/results/pipeline_memory.png``): bars per stage, one group per policy, stacked
weights / optimizer / activation slots; left the measured MLP (emulator carried state, equal to
the formula; dashed: the mesh executor's per-device state), right the 1B projection with 2BW
hatched (formula only).

Run: ``python benchmarks/pipeline_memory.py [--quick] [--width 4096] [--batch 512]``.

Results of the default run (N = 8, W = 4096, batch 512): ``benchmarks/results/pipeline_memory.md``
and ``.png``, quoted in docs/benchmarks.md.

References:
    Narayanan et al., "PipeDream", SOSP 2019 (weight stashing, ``N − k`` versions).
    Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training" (PipeDream-2BW),
    ICML 2021, arXiv:2006.09503. Chen et al., "SpecTrain", arXiv:1809.02839, 2018.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _host_devices

_host_devices.emulate()  # before jax is imported


import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from experiments.runs import markdown_table  # noqa: E402
from jaxstale import models, pipeline, schedules  # noqa: E402
from jaxstale.pipeline import emulator as pemulator  # noqa: E402
from jaxstale.pipeline import mesh as pmesh  # noqa: E402
from jaxstale.sizes import tree_bytes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = {"vanilla": "vanilla", "stash": "stash", "spectrain": "spectrain-v1"}
MU = 0.9
MIB, GB = 2**20, 1e9


def build_model(width: int, seed: int = 0) -> Any:
    """The MLP: ``width`` inputs, 8 hidden layers of ``width``, 10 classes (9 blocks)."""
    return models.create(
        "mlp", input_shape=(width, 1, 1), num_classes=10, hidden=(width,) * 8, seed=seed
    )


def _blocks(model: Any, n: int) -> list[list[tuple[int, int, bool, bool]]]:
    """Per stage, its blocks as ``(d_in, d_out, relu, flatten)``."""
    out = []
    for stage in models.split(model, n):
        out.append(
            [
                (b.linear.in_features, b.linear.out_features, bool(b.relu), bool(b.flatten))
                for b in stage.blocks
            ]
        )
    return out


def residual_bytes(blocks: list[tuple[int, int, bool, bool]], mb: int) -> int:
    """``R_k``: what a saved backward keeps per micro-batch for a stage of Dense blocks."""
    r = 0
    for j, (d_in, d_out, relu, flatten) in enumerate(blocks):
        if flatten:
            r += 4 * mb * d_in  # the flattened input
        if j > 0:
            r += 4 * mb * d_in  # the block's input (the previous block's output)
        if relu:
            r += 5 * mb * d_out  # ReLU: a bool mask and one float32 array
    return r


def formula(
    model: Any, n: int, mb: int, policy: str, versions: int | None = None
) -> list[dict[str, int]]:
    """Per stage, the formula's bytes for asynchronous 1F1B: ``weights`` (``V_k`` copies),
    ``optimizer``, ``slots`` and ``total``; ``versions`` overrides ``V_k`` (2BW: 2)."""
    pol = pipeline.get_policy(POLICIES.get(policy, policy))
    blocks = _blocks(model, n)
    rows = []
    for k, blk in enumerate(blocks):
        p = sum(d_in * d_out + d_out for d_in, d_out, _, _ in blk)
        v = versions if versions is not None else (n - k if pol.stash else 1)
        weights = v * 4 * p + (8 if pol.stash else 0)
        opt = 4 * p + ((4 * p + 4) if pol.predict else 0)
        slots = 0
        if k > 0:
            slots += (n - k + 1) * 4 * mb * blk[0][0]
        if k < n - 1:
            slots += 4 * mb * blk[-1][1] + (n - k) * residual_bytes(blk, mb)
        rows.append(
            {"params": p, "versions": v, "weights": weights, "optimizer": opt, "slots": slots}
        )
        rows[-1]["total"] = weights + opt + slots
    return rows


def carried(carry: dict[str, Any], n: int) -> list[dict[str, int]]:
    """Per stage, the bytes of the emulator's carry: ``weights`` (or stash), ``optimizer``,
    ``slots`` (inputs, cotangents, residuals, gradient accumulator, statistics), ``total``."""
    rows = []
    for k in range(n):
        w, o = tree_bytes(carry["weights"][k]), tree_bytes(carry["opt"][k])
        s = sum(tree_bytes(carry[f][k]) for f in ("inp", "ct", "res", "acc", "bn"))
        rows.append({"weights": w, "optimizer": o, "slots": s, "total": w + o + s})
    return rows


def mesh_formula(core: pmesh.MeshPipeline, predict: bool) -> int:
    """Bytes per device of the mesh executor's state (see the module docstring)."""
    p, c, s, a, r = core.p_max, core.capacity, core.slots, core.a_max, core.r_max
    opt = 4 * p + ((4 * p + 4) if predict else 0)
    return 4 * p + opt + 4 * p * c + 8 + 4 * s * (2 * a + r) + 8 * a + 4 * p + 4


def check_capacities(prog: pipeline.Program) -> None:
    """The program's slot capacities are the closed forms the formula uses (1F1B)."""
    n = prog.schedule.num_stages
    want_in = tuple(1 if k == 0 else n - k + 1 for k in range(n))
    want_res = tuple(n - k if k < n - 1 else 1 for k in range(n))
    if prog.in_cap != want_in or prog.res_cap != want_res or set(prog.ct_cap) != {1}:
        raise AssertionError(
            f"1F1B capacities changed: in {prog.in_cap}, res {prog.res_cap}, ct {prog.ct_cap}"
        )


def measure(model: Any, n: int, batch: int, policy: str) -> dict[str, Any]:
    """One policy: carried state, formula, XLA's analyses of the emulator round and mesh tick."""
    stages = models.functional_stages(model, n)
    nb = 2 * n + 2
    prog = pipeline.compile(schedules.one_f_one_b(n, nb), POLICIES[policy])
    check_capacities(prog)
    tx = optax.sgd(0.01, MU)
    d_in = model.blocks[0].linear.in_features
    x0 = jax.ShapeDtypeStruct((batch, d_in, 1, 1), jnp.float32)
    xb = jax.ShapeDtypeStruct((nb, batch, d_in, 1, 1), jnp.float32)
    yb = jax.ShapeDtypeStruct((nb, batch), jnp.int32)
    em = pemulator.PipelineEmulator(stages, prog, tx, momentum=MU)
    carry = jax.eval_shape(lambda: em.init(jnp.zeros(x0.shape, x0.dtype)))
    em_mem = em.memory_analysis(carry, xb, yb)
    core = pmesh.MeshPipeline(stages, prog, tx, np.zeros(x0.shape, np.float32), momentum=MU)
    state = jax.eval_shape(core.init)
    mesh_mem = core.memory_analysis(state, xb, yb)
    return {
        "policy": policy,
        "carried": carried(carry, n),
        "formula": formula(model, n, batch, policy),
        "emulator": em_mem,
        "emulator_data": tree_bytes((xb, yb)) + tree_bytes(prog.tables),
        "mesh": mesh_mem,
        "mesh_state": tree_bytes(state) // n,
        "mesh_fields": {f: tree_bytes(v) // n for f, v in state._asdict().items()},
        "mesh_formula": mesh_formula(core, prog.policy.predict is not None),
        "mesh_data": tree_bytes((xb, yb)),
        "mesh_sizes": {
            "P_max": core.p_max,
            "C": core.capacity,
            "S": core.slots,
            "A_max": core.a_max,
            "R_max": core.r_max,
        },
    }


def projection(n: int = 8, params: float = 1e9) -> dict[str, list[float]]:
    """Bytes per stage by formula for ``params`` parameters in ``n`` equal stages (fp32
    weights + SGD momentum, activations excluded); 2BW is formula only."""
    p = params / n
    copy = 4 * p
    out = {
        "vanilla": [copy + copy] * n,
        "stash": [(n - k) * copy + copy for k in range(n)],
        "spectrain": [copy + 2 * copy] * n,
        "2BW (formula only)": [2 * copy + copy] * n,
    }
    # the mesh executor: every device pads to the largest stage and the largest ring (C)
    out["mesh: vanilla"] = [copy * (1 + 1 + 1 + 1)] * n
    out["mesh: stash"] = [copy * (1 + n + 1 + 1)] * n
    out["mesh: spectrain"] = [copy * (1 + 1 + 2 + 1)] * n
    return out


def _mib(b: float) -> str:
    return f"{b / MIB:.1f}"


def _mesh_overheads(r: dict[str, Any]) -> str:
    """The mesh executor's per-device state by field, with its padding named."""
    f, z = r["mesh_fields"], r["mesh_sizes"]
    ring = f"ring {_mib(f['stash'])} (C={z['C']}"
    ring += " versions on every device)" if z["C"] > 1 else ": the current weights a 2nd time)"
    return (
        f"params {_mib(f['params'])} (P_max={z['P_max']:,}) + opt {_mib(f['opt_state'])} + "
        f"{ring} + grad acc {_mib(f['gacc'])} + inputs {_mib(f['acts'])} and cotangents "
        f"{_mib(f['cots'])} (S={z['S']} slots of A_max={z['A_max']:,} on every stage) + "
        f"residuals {_mib(f['res'])} (S × R_max={z['R_max']:,}, masks as float32) + inboxes "
        f"{_mib(f['inbox_f'] + f['inbox_b'])}; data replicated on every device "
        f"{_mib(r['mesh_data'])}"
    )


def tables(res: list[dict[str, Any]], n: int, model: Any, batch: int) -> str:
    """The markdown tables of a run."""
    pols = [r["policy"] for r in res]
    f2bw = formula(model, n, batch, "vanilla", versions=2)
    head = [
        "stage k",
        "params P_k",
        "V_k (stash)",
        "slots: inputs / residual sets",
        *[f"{p}: total (weights / opt / slots)" for p in pols],
        "2BW (formula only)",
        "carried = formula",
    ]
    rows = []
    for k in range(n):
        f0 = res[0]["formula"][k]
        cells = [
            k,
            f"{f0['params']:,}",
            res[pols.index("stash")]["formula"][k]["versions"] if "stash" in pols else "-",
            f"{0 if k == 0 else n - k + 1} / {0 if k == n - 1 else n - k}",
        ]
        for r in res:
            c = r["carried"][k]
            cells.append(
                f"{_mib(c['total'])} ({_mib(c['weights'])} / {_mib(c['optimizer'])} / "
                f"{_mib(c['slots'])})"
            )
        cells.append(_mib(f2bw[k]["total"]))
        same = all(r["carried"][k][f] == r["formula"][k][f] for r in res for f in r["carried"][k])
        cells.append("yes, to the byte" if same else "NO")
        rows.append(cells)
    tot = ["all (one device)", f"{sum(f['params'] for f in res[0]['formula']):,}", "", ""]
    tot += [_mib(sum(c["total"] for c in r["carried"])) for r in res]
    tot += [_mib(sum(f["total"] for f in f2bw)), ""]
    rows.append(tot)
    t1 = markdown_table(head, rows)

    head2 = [
        "policy",
        "executable",
        "arguments",
        "outputs",
        "aliased",
        "temporaries",
        "state (carried)",
        "formula",
        "overheads named",
    ]
    rows2 = []
    for r in res:
        em, ms = r["emulator"], r["mesh"]
        carried_total = sum(c["total"] for c in r["carried"])
        rows2.append(
            [
                r["policy"],
                "emulator round (all stages, 1 device)",
                _mib(em.argument_size_in_bytes),
                _mib(em.output_size_in_bytes),
                _mib(em.alias_size_in_bytes),
                _mib(em.temp_size_in_bytes),
                _mib(carried_total),
                _mib(sum(f["total"] for f in r["formula"])),
                f"arguments − state = {_mib(em.argument_size_in_bytes - carried_total)} "
                "(data, program tables)",
            ]
        )
        rows2.append(
            [
                r["policy"],
                "mesh tick (per device)",
                _mib(ms.argument_size_in_bytes),
                _mib(ms.output_size_in_bytes),
                _mib(ms.alias_size_in_bytes),
                _mib(ms.temp_size_in_bytes),
                _mib(r["mesh_state"]),
                _mib(r["mesh_formula"]),
                _mesh_overheads(r),
            ]
        )
    t2 = markdown_table(head2, rows2)

    proj = projection(8)
    head3 = ["policy", *[f"k={k}" for k in range(8)], "all stages"]
    rows3 = [[p, *[f"{v / GB:.2f}" for v in vs], f"{sum(vs) / GB:.1f}"] for p, vs in proj.items()]
    t3 = markdown_table(head3, rows3)
    return (
        f"Carried state per stage, emulator (= formula to the byte where marked '='):\n\n{t1}\n\n"
        f"XLA memory_analysis (MiB):\n\n{t2}\n\n"
        "Projection, 1B parameters in 8 equal stages, fp32 weights + SGD momentum, "
        f"activations excluded (GB per stage):\n\n{t3}"
    )


def plot(res: list[dict[str, Any]], n: int, path: str | None = None) -> Any:
    """Bars per stage and policy, stacked weights / optimizer / slots: the measured MLP (left)
    and the 1B projection (right); a matplotlib ``Figure``, saved to ``path`` if given."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.4))
    ax_m, ax_p = fig.subplots(1, 2)
    colors = {"vanilla": "tab:blue", "stash": "tab:orange", "spectrain": "tab:green"}
    colors["2BW (formula only)"] = "tab:purple"
    ks = np.arange(n)
    width = 0.8 / len(res)
    for i, r in enumerate(res):
        c = colors[r["policy"]]
        x = ks - 0.4 + (i + 0.5) * width
        w = np.asarray([s["weights"] for s in r["carried"]]) / MIB
        o = np.asarray([s["optimizer"] for s in r["carried"]]) / MIB
        s = np.asarray([s["slots"] for s in r["carried"]]) / MIB
        ax_m.bar(x, w, width, color=c, label=f"{r['policy']}: weights")
        ax_m.bar(x, o, width, bottom=w, color=c, alpha=0.55, label=f"{r['policy']}: optimizer")
        ax_m.bar(
            x,
            s,
            width,
            bottom=w + o,
            color=c,
            alpha=0.25,
            hatch="..",
            label=f"{r['policy']}: slots",
        )
        ax_m.axhline(
            r["mesh_state"] / MIB,
            color=c,
            ls="--",
            lw=1,
            label=f"{r['policy']}: mesh, every device",
        )
    ax_m.set_title(f"measured: N={n} MLP, emulator carried state (= formula)")
    ax_m.set_ylabel("MiB per stage")
    proj = projection(8)
    pols = ["vanilla", "stash", "spectrain", "2BW (formula only)"]
    width = 0.8 / len(pols)
    copy = 4 * 1e9 / 8 / GB
    k8 = np.arange(8)
    for i, p in enumerate(pols):
        x = k8 - 0.4 + (i + 0.5) * width
        tot = np.asarray(proj[p]) / GB
        opt = copy * (2 if p == "spectrain" else 1)
        hatch = "//" if "formula" in p else None
        ax_p.bar(x, tot - opt, width, color=colors[p], hatch=hatch, label=f"{p}: weights")
        ax_p.bar(x, np.full(8, opt), width, bottom=tot - opt, color=colors[p], alpha=0.55)
    for p in ("vanilla", "stash", "spectrain"):
        ax_p.axhline(
            proj[f"mesh: {p}"][0] / GB,
            color=colors[p],
            ls="--",
            lw=1,
            label=f"{p}: mesh, every device",
        )
    ax_p.set_title("projection: 1B parameters, 8 equal stages (fp32 + momentum)")
    ax_p.set_ylabel("GB per stage (weights; light: optimizer)")
    for ax, kk in ((ax_m, ks), (ax_p, k8)):
        ax.set_xticks(kk)
        ax.set_xlabel("stage k")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: N=4, a tiny MLP")
    ap.add_argument("--stages", type=int, default=None, help="N (default 8)")
    ap.add_argument("--width", type=int, default=None, help="MLP width W (default 4096)")
    ap.add_argument("--batch", type=int, default=None, help="(micro-)batch size (default 512)")
    ap.add_argument("--out", default=None, help="folder for the tables, rows and plot")
    ap.add_argument("--plot", default=None, help="plot path (default <out>/pipeline_memory.png)")
    args = ap.parse_args(argv)
    q = args.quick
    n = args.stages or (4 if q else 8)
    width = args.width or (32 if q else 4096)
    batch = args.batch or (8 if q else 512)
    if n > jax.device_count():
        raise SystemExit(
            f"N={n} needs {n} devices for the mesh executor, have {jax.device_count()}"
        )
    t0 = time.perf_counter()
    model = build_model(width)
    res = [measure(model, n, batch, p) for p in POLICIES]
    md = tables(res, n, model, batch)
    wall = time.perf_counter() - t0
    peak = {
        r["policy"]: (
            r["emulator"].argument_size_in_bytes + r["emulator"].temp_size_in_bytes,
            n * (r["mesh"].argument_size_in_bytes + r["mesh"].temp_size_in_bytes),
        )
        for r in res
    }
    note = (
        f"backend {jax.default_backend()}; MLP {width} -> 8 x {width} -> 10 "
        f"({models.param_count(model):,} parameters, {4 * models.param_count(model) / GB:.2f} GB "
        f"fp32), N={n}, asynchronous 1F1B, micro-batch = mini-batch {batch}, SGD momentum; "
        "analysed on abstract shapes (nothing allocated). A real run's peak (arguments + "
        "temporaries, XLA) would be "
        + ", ".join(
            f"{p}: {e / GB:.2f} GB on the emulator's device, {m / GB:.2f} GB over the mesh's "
            f"{n} devices"
            for p, (e, m) in peak.items()
        )
        + f"; total {wall:.0f} s"
    )
    print(md)
    print("\n" + note)
    out_dir = args.out or os.path.join(HERE, "results")
    plot_path = args.plot or os.path.join(out_dir, "pipeline_memory.png")
    os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
    plot(res, n, plot_path)
    print(f"plot: {plot_path}")
    rows = [
        {
            "policy": r["policy"],
            "carried": r["carried"],
            "formula": r["formula"],
            "mesh_state_per_device": r["mesh_state"],
            "mesh_formula_per_device": r["mesh_formula"],
            **{
                f"{ex}_{k}": int(getattr(r[ex], f"{k}_size_in_bytes"))
                for ex in ("emulator", "mesh")
                for k in ("argument", "output", "alias", "temp")
            },
        }
        for r in res
    ]
    if args.out:
        with open(os.path.join(args.out, "pipeline_memory.md"), "w") as f:
            f.write(md + "\n\n" + note + "\n")
        with open(os.path.join(args.out, "pipeline_memory.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return {"rows": rows, "markdown": md, "note": note, "plot": plot_path, "seconds": wall}


if __name__ == "__main__":
    main()
