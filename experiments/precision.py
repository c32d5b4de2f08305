"""The experiments' compute precision (``--precision``): float32, or a GPT's bf16 mixed
precision (:func:`jaxstale.models.gpt.gpt`'s ``dtype``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the experiments whose models honour ``--precision bf16`` (the GPT's ``dtype``)
MIXED = (
    "async_workers", "constant_delay", "delay_cliff", "local_sgd", "pipeline_staleness",
    "sync_baseline",
)  # fmt: skip


def gpt_kw(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The GPT builder's keywords of a resolved config's precision (``dtype``), or none."""
    return {"dtype": "bfloat16"} if cfg.get("precision") == "bf16" else {}


def with_precision(experiment: str, cfg: dict[str, Any], config: Any) -> dict[str, Any]:
    """``cfg`` with ``"precision": "bf16"`` where the config asks for it (float32 leaves the
    config, and so its run folder, as it always was).

    Raises:
        ConfigError: bf16 for an experiment that computes in float32 only, or a model that is
            not a GPT.
    """
    from .config import ConfigError

    p = getattr(config, "precision", "float32")
    if p == "float32":
        return cfg
    if experiment not in MIXED:
        raise ConfigError(
            "precision", f"{experiment} computes in float32 only (bf16: {', '.join(MIXED)})"
        )
    names = cfg.get("models") or [cfg.get("model")]
    if bad := [str(n) for n in names if not str(n).startswith("gpt")]:
        raise ConfigError(
            "precision",
            f"bf16 is a GPT's compute precision (bfloat16 products, float32 weights); "
            f"{', '.join(bad)} {'computes' if len(bad) == 1 else 'compute'} in float32",
        )
    return {**cfg, "precision": p}


def prepared(experiment: str, prepare: Any, config: Any) -> tuple[dict[str, Any], Any]:
    """``prepare(config)`` (the resolved config and its dataset), the config's precision added
    (:func:`with_precision`)."""
    cfg, ds = prepare(config)
    return with_precision(experiment, cfg, config), ds
