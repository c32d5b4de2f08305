"""The gpt-cpu training step against a PyTorch GPT of the same shape, one thread each (issue 54).

Both sides train the same architecture on the same batch: the ``gpt-cpu`` preset (8 pre-norm
blocks of width 64, 4 heads, a GELU MLP of 4·64, separate input and output embeddings; context
64, vocabulary 83 — 414,803 parameters on both sides, checked; the PyTorch model starts from
the library model's weights, :func:`torch_weights`), ``B × 64`` random ids, next-token
cross-entropy, AdamW (β = 0.9 / 0.95, decay 0.1 on every matrix, the gradient's global norm clipped
at 1). The PyTorch model is written here in nanoGPT's form (``F.scaled_dot_product_attention``
with ``is_causal``, ``nn.GELU`` — exact erf —, ``torch.optim.AdamW``), eager and, with
``--compile``, under ``torch.compile``. Each side is timed by phase — the forward (loss only),
forward + backward (the gradient), the whole step (with the optimizer) — so the backward's cost
is ``grad − forward``. The JAX side runs the library's model (``jaxstale``) and three variants
of its formulation, to find where XLA:CPU's backward loses: ``dpa`` (the attention as
``jax.nn.dot_product_attention(is_causal=True)`` instead of the explicit mask and softmax),
``erf`` (the exact GELU, as PyTorch's default, instead of the tanh approximation), ``dpa+erf``.

Timings are wall seconds per call with the process pinned to one core (:func:`pin`) and both
libraries asked for one thread (``intra_op_parallelism_threads=1``, ``torch.set_num_threads(1)``):
XLA:CPU's runtime still runs a second thread beside its caller, so CPU time of an unpinned
process counts its waiting (at e447cd3 the issue's "backward 2.4×" was CPU time: 121 ms a step).
Every variant is timed once per round in a rotating order; the table gives medians over rounds
and the ratio to PyTorch eager's same phase; then where the gradient's time goes on each side,
from each library's profiler (matrix products, PyTorch's fused attention kernel, the other ops,
and the time between ops). Run it on an idle core for absolute figures.

Run: ``python benchmarks/lm_step_torch.py [--quick] [--compile] [--out DIR]`` (needs
``torch``; without it the script says so and stops).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # `python benchmarks/<name>.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# one XLA:CPU thread, set before jax is imported (run as a script only: an importer's
# environment, and the processes it starts, are left as they are)
_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAGS).strip()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import _results  # noqa: E402
from benchmarks._timing import rotating  # noqa: E402
from jaxstale import losses, models, optimizers  # noqa: E402
from jaxstale.models.gpt import PRESETS, GPTBlock  # noqa: E402

CONTEXT, VOCAB, PRESET = 64, 83, "cpu"
PHASES = ("forward", "grad", "step")
VARIANTS = ("jaxstale", "dpa", "erf", "dpa+erf")


def _attend_dpa(self: Any, x: jax.Array) -> jax.Array:
    """:meth:`GPTBlock._attend` with the attention as ``jax.nn.dot_product_attention``."""
    b, t, d = x.shape
    h = self.heads
    q, k, v = (a.reshape(b, t, h, d // h) for a in jnp.split(self.qkv(x), 3, axis=-1))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    return self.proj(out.reshape(b, t, d))


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """The library's model traced with ``name``'s formulation (``VARIANTS``)."""
    attend, gelu = GPTBlock._attend, jax.nn.gelu
    if "dpa" in name:
        GPTBlock._attend = _attend_dpa  # type: ignore[method-assign]
    if "erf" in name:
        jax.nn.gelu = lambda x, approximate=True: gelu(x, approximate=False)  # type: ignore[assignment]
    try:
        yield
    finally:
        GPTBlock._attend, jax.nn.gelu = attend, gelu  # type: ignore[method-assign]


def _batch(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (batch, CONTEXT)).astype(np.int64)
    return x, rng.integers(0, VOCAB, (batch, CONTEXT)).astype(np.int64)


def jax_phases(name: str, batch: int) -> tuple[dict[str, Callable[[], Any]], int, dict[str, Any]]:
    """``{phase: call}`` of the JAX variant ``name`` (each call runs one jitted step and waits
    for it), its parameter count and ``{phase: compiled program}``."""
    model = models.create(f"gpt-{PRESET}", input_shape=(CONTEXT,), num_classes=VOCAB, seed=0)
    fn = models.functional(model)
    tx = optimizers.adamw(1e-3, 10_000, warmup_steps=10)
    xb, yb = (jnp.asarray(a, jnp.int32) for a in _batch(batch))

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return losses.cross_entropy(fn.apply(p, fn.state, x, True)[0], y)

    def step(p: Any, opt: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        upd, opt = tx.update(grads, opt, p)
        return jax.tree.map(lambda a, u: a + u, p, upd), opt, value

    params = jax.tree.map(jnp.array, fn.params)
    with variant(name):
        fwd = jax.jit(loss).lower(params, xb, yb).compile()
        grad = jax.jit(jax.value_and_grad(loss)).lower(params, xb, yb).compile()
        carry = [jax.tree.map(jnp.copy, params), tx.init(params)]  # donated: its own copy
        full = jax.jit(step, donate_argnums=(0, 1)).lower(*carry, xb, yb).compile()

    def run_step() -> Any:
        carry[0], carry[1], value = full(carry[0], carry[1], xb, yb)
        return jax.block_until_ready(value)

    n = int(sum(np.size(a) for a in jax.tree.leaves(params)))
    phases = {
        "forward": lambda: jax.block_until_ready(fwd(params, xb, yb)),
        "grad": lambda: jax.block_until_ready(grad(params, xb, yb)),
        "step": run_step,
    }
    return phases, n, {"forward": fwd, "grad": grad, "step": full, "params": fn.params}


def torch_phases(
    batch: int, compile_: bool, params: Any = None
) -> tuple[dict[str, Callable[[], Any]], int, Any]:
    """``{phase: call}`` of the PyTorch GPT (eager, or ``torch.compile``d), its parameter
    count and the model; with ``params`` (the library model's), it starts from those weights."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    shape = PRESETS[PRESET]
    d, h, layers = shape["width"], shape["heads"], shape["layers"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)  # Flax's
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.gelu = nn.GELU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (a.view(b, t, h, d // h).transpose(1, 2) for a in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(self.gelu(self.up(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, d), nn.Embedding(CONTEXT, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.out = nn.LayerNorm(d, eps=1e-6), nn.Linear(d, VOCAB)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(x.shape[1])
            z = self.tokens(x) + self.positions(pos)
            for blk in self.blocks:
                z = blk(z)
            logits = self.out(self.ln_f(z))
            return F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))

    torch.manual_seed(0)
    model = GPT()
    if params is not None:
        with torch.no_grad():
            for name, value in torch_weights(params).items():
                model.get_parameter(name).copy_(torch.from_numpy(value))
    decay = [p for p in model.parameters() if p.dim() >= 2]  # as the library's: every matrix
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95),
    )  # fmt: skip
    x, y = (torch.from_numpy(a) for a in _batch(batch))
    fwd = torch.compile(model) if compile_ else model

    def forward() -> Any:
        with torch.no_grad():
            return fwd(x, y).item()

    def grad() -> Any:
        model.zero_grad(set_to_none=True)
        value = fwd(x, y)
        value.backward()
        return value.item()

    def step() -> Any:
        value = grad()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return value

    n = sum(p.numel() for p in model.parameters())
    return {"forward": forward, "grad": grad, "step": step}, n, model


def torch_weights(params: Any) -> dict[str, np.ndarray]:
    """The library GPT's weights under the PyTorch model's parameter names (kernels
    transposed: ``nn.Linear`` keeps ``[out, in]``)."""
    out: dict[str, np.ndarray] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [
            str(k.key if hasattr(k, "key") else k.idx)
            for k in path
            if hasattr(k, "key") or hasattr(k, "idx")
        ]  # fmt: skip  (nnx's ".value" attribute left out)
        block, layer, kind = int(keys[1]), keys[2], keys[-1]
        value = np.array(leaf, np.float32)
        if layer == "tokens":
            out["tokens.weight"] = value
        elif layer == "positions":
            out["positions.weight"] = value
        else:
            at = f"{layer}." if layer in ("ln_f", "out") else f"blocks.{block}.{layer}."
            name = {"kernel": "weight", "scale": "weight", "bias": "bias"}[kind]
            out[at + name] = value.T.copy() if kind == "kernel" else value
    return out


#: the op names counted as matrix products: XLA's (``dot``, ``dot_general``, the YNNPACK
#: fusions, which the executors' compiler options restrict to products) and ATen's kernels
_JAX_PRODUCTS = ("dot", "ynn_fusion", "convolution")
_TORCH_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
CATEGORIES = ("matrix products", "fused attention", "other ops", "between ops")


def jax_breakdown(call: Callable[[], Any], program: Any, calls: int) -> dict[str, float]:
    """ms per call of ``program``'s ops by :data:`CATEGORIES`, from a ``jax.profiler`` trace of
    ``calls`` calls (each op of the program is a trace event named as its HLO instruction)."""
    import glob
    import gzip
    import json
    import re
    import tempfile

    text = program.as_text()
    ops = set(re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = ", text[text.index("ENTRY") :], re.M))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            wall = time.perf_counter() - t0
        (path,) = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)
        trace = json.load(gzip.open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = dict.fromkeys(CATEGORIES, 0.0)
    for e in events:
        if e.get("ph") == "X" and e.get("name") in ops:
            kind = "matrix products" if e["name"].startswith(_JAX_PRODUCTS) else "other ops"
            out[kind] += e.get("dur", 0.0) / 1e3 / calls
    out["between ops"] = 1e3 * wall / calls - out["matrix products"] - out["other ops"]
    return out


def torch_breakdown(call: Callable[[], Any], calls: int) -> dict[str, float]:
    """ms per call of ``call``'s ATen ops by :data:`CATEGORIES` (self CPU time, from
    ``torch.profiler``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        wall = time.perf_counter() - t0
    out = dict.fromkeys(CATEGORIES, 0.0)
    for e in prof.key_averages():
        if e.key.startswith(_TORCH_PRODUCTS):
            kind = "matrix products"
        elif e.key.startswith("aten::_scaled_dot_product"):
            kind = "fused attention"
        elif e.key.startswith("aten::"):
            kind = "other ops"
        else:
            continue  # autograd's and the profiler's own frames: "between ops"
        out[kind] += e.self_cpu_time_total / 1e3 / calls
    out["between ops"] = 1e3 * wall / calls - sum(out[k] for k in CATEGORIES[:3])
    return out


def pin() -> int:
    """Pin this process (its threads to come: XLA's and PyTorch's pools) to one core, the
    last it may run on; returns it."""
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="calls timed per variant per round")
    parser.add_argument("--compile", action="store_true", help="torch.compile too")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 call, not written")
    parser.add_argument("--out", default=None, help="folder of the table (default results/)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("lm_step_torch: needs torch (pip install torch); not run")
        return {}
    torch.set_num_threads(1)
    if args.quick:
        args.rounds, args.steps = 2, 1
    t_start = time.perf_counter()
    jaxes = {v: jax_phases(v, args.batch_size) for v in VARIANTS}
    sides = {v: (ph, n) for v, (ph, n, _) in jaxes.items()}
    start = jaxes["jaxstale"][2]["params"]  # both sides start from the same weights
    sides["torch eager"] = torch_phases(args.batch_size, False, start)[:2]
    if args.compile:
        sides["torch.compile"] = torch_phases(args.batch_size, True, start)[:2]
    counts = {name: n for name, (_, n) in sides.items()}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"lm_step_torch: the two sides differ in size: {counts}")
    calls = {f"{s}/{p}": c for s, (ph, _) in sides.items() for p, c in ph.items()}
    for c in calls.values():  # the first call (compiles, allocates), outside the timings
        c()
    times = rotating(calls, args.rounds, args.steps)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    ms = {s: {p: med[f"{s}/{p}"] for p in PHASES} for s in sides}
    for s in ms:
        ms[s]["backward"] = ms[s]["grad"] - ms[s]["forward"]
    base = ms["torch eager"]
    n_prof = 2 if args.quick else 10
    split = {
        "jaxstale": jax_breakdown(
            jaxes["jaxstale"][0]["grad"], jaxes["jaxstale"][2]["grad"], n_prof
        ),
        "torch eager": torch_breakdown(sides["torch eager"][0]["grad"], n_prof),
    }
    tokens = args.batch_size * CONTEXT
    lines = [
        f"gpt-{PRESET} ({counts['jaxstale']:,} parameters), batch {args.batch_size} × "
        f"{CONTEXT} ({tokens} tokens), the process pinned to one core, one thread each "
        f"(torch {torch.__version__}, jax {jax.__version__}); wall ms per call, median of "
        f"{args.rounds} interleaved rounds × {args.steps} calls (backward = grad − forward); "
        "in brackets: / PyTorch eager's same phase.",
        "",
        "| variant | forward | backward | grad (fwd + bwd) | step (+ AdamW) |",
        "|---|---|---|---|---|",
    ]
    for s, row in ms.items():
        cells = [f"{row[p]:.1f} ({row[p] / base[p]:.2f}×)" for p in ("forward", "backward")]
        cells += [f"{row[p]:.1f} ({row[p] / base[p]:.2f}×)" for p in ("grad", "step")]
        lines.append(f"| {s} | {' | '.join(cells)} |")
    lines += [
        "",
        f"Where the gradient's time goes (ms per call, {n_prof} calls under each side's "
        "profiler, which slows both: XLA's ops are its HLO instructions, PyTorch's ATen's self "
        "times; between ops = wall − the ops):",
        "",
        "| side | " + " | ".join(CATEGORIES) + " | wall |",
        "|---|" + "---|" * (len(CATEGORIES) + 1),
    ]
    for s, row in split.items():
        wall = sum(row.values())
        lines.append(
            f"| {s} | " + " | ".join(f"{row[k]:.1f}" for k in CATEGORIES) + f" | {wall:.1f} |"
        )
    lines += ["", f"Total wall time {time.perf_counter() - t_start:.0f} s."]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        _results.write("lm_step_torch", table, args.out)
    return {"ms": ms, "counts": counts, "split": split, "table": table, "tokens": tokens}


if __name__ == "__main__":
    pin()
    main()
