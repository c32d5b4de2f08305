"""Paper-scale configurations of the experiments (``async_workers --preset NAME``): the
papers' set-ups as far as the emulator goes, with the papers' own numbers printed beside ours.
Data, not an experiment: they need prepared TFDS data and, at their budgets, a GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import runs

__all__ = ["PRESETS", "paper_table"]

#: paper-scale configurations (``--preset``) for users with a GPU and prepared TFDS data: the
#: papers' set-ups as far as the emulator goes, and the papers' own test errors (%) printed
#: beside ours. Differences from the papers are named in ``"differs"``.
PRESETS: dict[str, dict[str, Any]] = {
    "dc-asgd-cifar10": {
        "source": "Zheng et al., ICML 2017, Table 1 (CIFAR-10, ResNet-20, 160 epochs)",
        "config": {
            "dataset": "cifar10",
            "standardize": "channel",
            "model": "resnet20",
            "methods": ["sgd", "ssgd", "asgd", "dc-asgd-c", "dc-asgd-a"],
            "workers": [4, 8],
            "momentum": [0.9],
            "lrs": [0.05, 0.1, 0.2, 0.5],
            "batch_size": 128,
            "updates": 160 * 50_000 // 128,  # 160 epochs of 50,000 images, equal samples
            "seeds": 5,
        },
        "differs": "no step decay of the rate (the paper divides it by 10 at epochs 80 and "
        "120); no data augmentation; the rate is selected on our validation split",
        "paper_error": {
            ("sgd", 1): 8.65,
            ("asgd", 4): 9.27,
            ("ssgd", 4): 9.17,
            ("dc-asgd-c", 4): 8.67,
            ("dc-asgd-a", 4): 8.19,
            ("asgd", 8): 10.26,
            ("ssgd", 8): 10.10,
            ("dc-asgd-c", 8): 9.27,
            ("dc-asgd-a", 8): 8.57,
        },
    },
    "lc-asgd-cifar10": {
        "source": "Li et al., ICPP 2020 (CIFAR-10, ResNet-18; LC-ASGD with BN / Async-BN)",
        "config": {
            "dataset": "cifar10",
            "standardize": "channel",
            "model": "resnet20",
            "methods": ["sgd", "ssgd", "asgd", "dc-asgd-a", "lc-asgd", "lc-asgd-async-bn"],
            "workers": [4, 8, 16],
            "momentum": [0.9],
            "lrs": [0.05, 0.1, 0.2],
            "batch_size": 128,
            "updates": 160 * 50_000 // 128,
            "seeds": 5,
        },
        "differs": "ResNet-20 instead of ResNet-18 (the zoo's CIFAR ResNet); no step decay, no "
        "augmentation; the rate and λ are selected on our validation split",
        "paper_error": {
            ("sgd", 1): 5.15,
            ("ssgd", 4): 5.67,
            ("asgd", 4): 5.73,
            ("dc-asgd-a", 4): 5.33,
            ("lc-asgd", 4): 4.98,
            ("lc-asgd-async-bn", 4): 4.87,
            ("ssgd", 8): 6.19,
            ("asgd", 8): 6.38,
            ("dc-asgd-a", 8): 5.72,
            ("lc-asgd", 8): 5.11,
            ("lc-asgd-async-bn", 8): 4.96,
            ("ssgd", 16): 6.41,
            ("asgd", 16): 6.59,
            ("dc-asgd-a", 16): 6.05,
            ("lc-asgd", 16): 5.76,
            ("lc-asgd-async-bn", 16): 5.52,
        },
    },
}


def paper_table(cfg: dict[str, Any], pick: Callable[[str, int], list[dict] | None]) -> str:
    """Our test error % at the selected rate beside the paper's, for a ``--preset`` run of
    ``async_workers``: ``pick(method, M)`` gives the rows at the selected rate (None: the
    method does not run at that M)."""
    pre = PRESETS[cfg["preset"]]
    body = []
    for method in cfg["methods"]:
        cells = []
        for m in [1, *cfg["workers"]]:
            got = pick(method, m)
            if got is None:
                cells.append("–")
                continue
            errs = [r["final_test_error"] for r in got]
            ours = runs.format_ci(errs, diverged=[r["diverged"] for r in got]) if got else "–"
            paper = pre["paper_error"].get((method, m))
            cells.append(f"{ours} (paper {paper:.2f})" if paper is not None else ours)
        body.append([method, *cells])
    heads = ["method", *(f"M={m}" for m in [1, *cfg["workers"]])]
    return (
        f"**Test error % beside the paper's — preset {cfg['preset']}: {pre['source']}. Differs "
        f"from the paper: {pre['differs']}.**\n\n" + runs.markdown_table(heads, body)
    )
