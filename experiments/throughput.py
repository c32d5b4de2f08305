"""Throughput and model FLOPs utilisation of a language-model run, for its row and its log.

``tokens_per_s`` is the tokens a run trained on, ``steps · batch · T``, over its share of its
group's wall time (``wall_s``: the lanes of a vmapped group share one clock) — the group's
rate, every lane's tokens over the group's wall time; ``flops_per_token``
is :func:`jaxstale.flops.gpt_flops_per_token` of the zoo GPT's shape (None for a model of your
own); ``mfu`` divides their product by the device's dense peak in the precision the step
computes in — float32, which XLA runs at TF32 on NVIDIA GPUs — or is None where that peak is
unknown (every CPU: :data:`jaxstale.flops.PEAK_FLOPS`). Timing, not results: a recomputed cell
may differ in them (:data:`experiments.runs.groups.TIMING_FIELDS`).
"""

from __future__ import annotations

import sys

import jax

from jaxstale import data, flops
from jaxstale.models.gpt import preset_of

__all__ = ["lm_throughput", "log_throughput"]


def lm_throughput(model: str, ds: data.Dataset, steps: int, batch: int, wall: float) -> dict:
    """``{"tokens_per_s", "flops_per_token", "mfu"}`` of one run (empty for a classifier)."""
    if ds.task != "language_model" or wall <= 0:
        return {}
    t = int(ds.x_train.shape[1])
    tps = steps * batch * t / wall
    shape = preset_of(model)  # the attention spans the data's windows, the head the model's ids
    fpt = flops.gpt_flops_per_token(**{"vocab": int(ds.num_classes), **shape, "context": t}) \
        if shape else None  # fmt: skip
    dev = jax.devices()[0]
    precision = "tf32" if dev.platform == "gpu" else "float32"
    got = flops.mfu(tps, fpt, dev.device_kind, precision) if fpt else None
    return {"tokens_per_s": round(tps, 1), "flops_per_token": fpt,
            "mfu": None if got is None else round(got, 4)}  # fmt: skip


def log_throughput(experiment: str, what: str, runs: int, got: dict) -> None:
    """One line on stderr: the group's tokens per second and MFU (or why none)."""
    if not got:
        return
    mfu = got["mfu"]
    kind = jax.devices()[0].device_kind
    share = f"{got['tokens_per_s']:,.0f} tokens/s over its {runs} runs"
    util = f"MFU {100 * mfu:.1f} %" if mfu is not None else f"MFU unknown ({kind}: no peak known)"
    print(f"[{experiment}] {what}: {share}, {util}", file=sys.stderr)
