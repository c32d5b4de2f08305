"""A hand-built fact of ``budget.json`` (the Budget section's per-arm record), shared by the
claims tests that build run folders: :func:`fact`."""

from typing import Any


def fact(
    method: str,
    flat_since: int | None,
    delta: list[float],
    metric: str | None = None,
    plateau: float | None = 0.8,
) -> dict[str, Any]:
    """One arm's budget fact: flat from ``flat_since`` (None: never), ``delta`` the last
    third's mean rise, its interval and seeds; ``metric`` only where it is not accuracy."""
    f = {"setting": {"method": method}, "lr": 0.01, "steps": 600, "plateau": plateau,
         "flat_since": flat_since, "delta_last_third": delta}  # fmt: skip
    return {**f, "metric": metric} if metric else f
