"""Local SGD's memory: what the emulator carries, per part, against the formula; per worker.

The local-SGD emulator (``jaxstale.localsgd.executor``) carries from one outer update to the
next: the global weights ``θ``, the outer optimizer's state, each worker's inner optimizer
state (it persists across jobs), and — asynchronous — each worker's dispatch point or —
streaming — each replica's weights (replicas outlive a sync: only one fragment merges at a
time). Measured from abstract shapes (``jax.eval_shape`` of ``init``: nothing is allocated),
for the MLP and ``gpt-cpu``, AdamW inner, against:

**Formula** (bytes; ``P`` parameters in float32, ``M`` workers; AdamW's state ``8P`` plus a
4-byte count and its injected hyper-parameters; Nesterov ``4P``; Delayed Nesterov ``8P`` plus a
count: momentum and buffer; ``F`` fragments):

- synchronous DiLoCo: ``4P (θ) + 4P (outer) + M·(8P + c)``;
- Streaming DiLoCo: ``4P (θ: the fragments' global copies) + 4P (the fragments' outer states)
  + M·(8P + c) + M·4P (replicas)``;
- asynchronous local SGD: ``4P + 8P (Delayed Nesterov) + M·(8P + c) + M·4P (dispatch points)``.

**One worker of a real deployment** holds its replica ``4P``, its inner state ``8P``, the
global copy ``4P`` and the outer state ``4P`` (DiLoCo's replicas all run the outer step), plus
Streaming DiLoCo's in-flight snapshot of one fragment ``4P/F`` during the overlap: ``20P``
(``20P + 4P/F``), against data parallelism's ``12P`` (weights and AdamW); at 1B parameters,
18.6 GiB (+ 1.9 GiB at ``F = 2``) against 11.2 GiB, activations excluded.

Run: ``python benchmarks/localsgd_memory.py [--out DIR]``; prints the tables and writes them to
``<--out>/localsgd_memory.md`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from benchmarks._results import write as write_result
from experiments.runs import markdown_table
from jaxstale import localsgd, models, optimizers
from jaxstale.sizes import tree_bytes
from jaxstale.transforms.outer import delayed_nesterov, outer_nesterov

KINDS = ("diloco", "streaming", "async")


def _model(name: str) -> tuple[Any, np.ndarray, np.ndarray]:
    if name == "mlp":
        f = models.functional(models.create("mlp", input_shape=(40, 1), num_classes=10))
        return f, np.zeros((8, 4, 40, 1), np.float32), np.zeros((8, 4), np.int32)
    f = models.functional(models.create(name, input_shape=(64,), num_classes=83))
    return f, np.zeros((8, 4, 64), np.int32), np.zeros((8, 4, 64), np.int32)


def measure(name: str, kind: str, m: int, fragments: int = 2) -> dict[str, Any]:
    """The emulator's carried bytes per part, and the formula's."""
    f, xb, yb = _model(name)
    inner = optimizers.per_stage("adamw", 1e-3, 0.9, 100)
    p = tree_bytes(f.params)  # 4P
    count = tree_bytes(inner.init(f.params)) - 2 * p  # AdamW's count and injected hyper-parameters
    kw: dict[str, Any] = {}
    if kind == "async":
        sched = localsgd.asynchronous(m, 2, 2, seed=0)
        outer, outer_bytes = delayed_nesterov(0.5, 0.9, m), 2 * p + 4
    else:
        sched = localsgd.synchronous(m, 1, 2)
        outer, outer_bytes = outer_nesterov(0.7, 0.9), p
    if kind == "streaming":
        kw = {"fragments": fragments}
    xb = np.zeros((sched.num_batches, *xb.shape[1:]), xb.dtype)
    yb = np.zeros((sched.num_batches, *yb.shape[1:]), yb.dtype)
    ex = localsgd.executor(f.apply, inner, outer, sched, xb, yb, **kw)
    state = jax.eval_shape(ex.init, f.params, f.state)
    parts = {k: tree_bytes(v) for k, v in state.items()}
    formula = {
        "theta": p,
        "outer": outer_bytes,
        "inner": m * (2 * p + count),
        "version": 4,
        "model_state": 0,
    }
    if kind == "async":
        formula["dispatch"] = m * p
    if kind == "streaming":
        formula["replicas"] = m * p
    return {"model": name, "kind": kind, "M": m, "P": p // 4, "parts": parts, "formula": formula}


def _mib(b: float) -> str:
    return f"{b / 2**20:.3f}"


def tables(res: list[dict[str, Any]]) -> str:
    """The carried-state table (MiB, per part) with the formula's total."""
    parts = ["theta", "outer", "inner", "replicas", "dispatch"]
    body = []
    for r in res:
        got, want = sum(r["parts"].values()), sum(r["formula"].values())
        cells = [_mib(r["parts"].get(k, 0)) if k in r["parts"] else "–" for k in parts]
        same = "yes" if got == want else f"{got - want:+d} B"
        body.append([r["model"], f"{r['P']:,}", r["kind"], str(r["M"]), *cells,
                     _mib(got), _mib(want), same])  # fmt: skip
    heads = ["model", "P", "kind", "M", "θ", "outer", "inner (all workers)", "replicas",
             "dispatch", "carried", "formula", "equal"]  # fmt: skip
    per = [
        ["data parallelism (AdamW)", "12P", f"{12e9 / 2**30:.1f}"],
        ["DiLoCo / asynchronous local SGD", "20P", f"{20e9 / 2**30:.1f}"],
        ["Streaming DiLoCo, F = 2 (overlap in flight)", "20P + 4P/F", f"{22e9 / 2**30:.1f}"],
    ]
    return (
        "Local-SGD emulator: carried state (MiB; AdamW inner; outer Nesterov, Delayed Nesterov "
        "when asynchronous; Streaming DiLoCo with F = 2):\n\n"
        + markdown_table(heads, body)
        + "\n\nOne worker of a deployment at P = 1B (GiB, float32, activations excluded):\n\n"
        + markdown_table(["setting", "bytes", "GiB at 1B"], per)
    )


def main(argv: list[str] | None = None) -> str:
    """Measures every model × kind at ``M = 4`` and ``M = 8``; prints and writes the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt-cpu"])
    ap.add_argument("--out", default=None, help="folder of localsgd_memory.md")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    res = [measure(n, k, m) for n in args.models for k in KINDS for m in (4, 8)]
    text = tables(res)
    print(text)
    if not args.no_write:
        write_result("localsgd_memory", text, args.out)
    return text


if __name__ == "__main__":
    main()
