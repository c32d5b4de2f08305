r"""The per-stage optimizers of the language-model workloads: AdamW, NAdamW, Muon, SGD.

Each factory returns an optax transformation for one pipeline stage (or one data-parallel
worker) with the usual language-model recipe: linear warm-up then cosine decay to
``final_fraction`` of the peak rate over ``total_steps``
(:func:`optax.warmup_cosine_decay_schedule`), weight decay on the matrices only (``ndim ≥ 2``:
not on biases, norms' scales), and **gradient clipping per stage**: the global norm of a
pipeline's gradient would need every stage's gradient, which an asynchronous pipeline never has
at one time (each stage updates with its own mini-batch's gradient), so ``clip`` bounds the norm
of the stage's own gradient — the same as global clipping with one stage.

* :func:`adamw`: AdamW, ``β2 = 0.95`` (GPT training's);
* :func:`nadamw`: NAdamW with AsyncPP's ``β1 = 0.99`` (Adam with a Nesterov look-ahead of the
  first moment, the momentum correction AsyncPP relies on for stale weights);
* :func:`muon`: Muon (:func:`optax.contrib.muon`: Newton–Schulz-orthogonalised momentum) on the
  hidden 2-D weights, AdamW on the rest — embeddings, the output head, biases and norms, which
  is the standard split (``exclude``: the names of the parameters kept on AdamW; optax's Adam
  branch is the Nesterov form, NAdamW);
* :func:`rotated`: AdamW in a rotated basis per hidden weight matrix (basis rotation, Jung,
  Shin, Lee 2026: :func:`jaxstale.basis_rotation`), the embeddings, head, biases and norms on
  AdamW — the split of the authors' code;
* :func:`sgd`: SGD with momentum, the same schedule and clipping.

References:
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019 (AdamW);
    Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop (NAdam);
    Ajanthan et al., "Nesterov Method for Asynchronous Pipeline Parallel Optimization",
    ICML 2025, arXiv 2505.01099 (AsyncPP: NAdam, β1 0.99); Jordan et al., "Muon: an optimizer
    for hidden layers in neural networks", 2024; Jung, Shin, Lee, "Mitigating Staleness in
    Asynchronous Pipeline Parallelism via Basis Rotation", ICML 2026, arXiv 2602.03515.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax import contrib

from jaxstale._checks import check_range

__all__ = [
    "EXCLUDE",
    "LABELS",
    "NAMES",
    "WARMUP_FRACTION",
    "adamw",
    "asyncpp_b1",
    "injected",
    "muon",
    "muon_weights",
    "nadamw",
    "per_stage",
    "rotated",
    "schedule",
    "set_hyperparams",
    "sgd",
]

#: parameter names kept on AdamW under :func:`muon` (``jaxstale.models.gpt``'s embeddings and
#: head)
EXCLUDE = ("tokens", "positions", "out")


def schedule(
    peak: float, total_steps: int, *, warmup_steps: int = 0, final_fraction: float = 0.1
) -> optax.Schedule:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, then cosine decay to
    ``final_fraction · peak`` at ``total_steps``.

    Example:
        >>> s = schedule(1.0, 100, warmup_steps=10)
        >>> [round(float(s(t)), 3) for t in (0, 5, 10, 100)]
        [0.0, 0.5, 1.0, 0.1]
    """
    check_range(peak, "peak", "schedule", 0.0)
    check_range(final_fraction, "final_fraction", "schedule", 0.0, 1.0, high_open=False)
    if total_steps < 1 or not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"schedule: need 0 <= warmup_steps < total_steps, got {warmup_steps}, {total_steps}"
        )
    return optax.warmup_cosine_decay_schedule(
        0.0, peak, warmup_steps, total_steps, end_value=final_fraction * peak
    )


def _matrices(params: Any) -> Any:
    return jax.tree.map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def _clipped(tx: optax.GradientTransformation, clip: float | None) -> optax.GradientTransformation:
    return tx if clip is None else optax.chain(optax.clip_by_global_norm(clip), tx)


def _check_moments(where: str, weight_decay: float, clip: float | None, **decays: float) -> None:
    """The decays in ``[0, 1)``, the weight decay ``>= 0``, the clip ``> 0`` (or None): a β of
    1.5 or a negative decay was accepted before and trained to NaN or grew the weights."""
    for name, value in decays.items():
        check_range(value, name, where, 0.0, 1.0)
    check_range(weight_decay, "weight_decay", where, 0.0)
    if clip is not None:
        check_range(clip, "clip", where, 0.0, low_open=True)


def adamw(
    peak: float,
    total_steps: int,
    *,
    warmup_steps: int = 0,
    b1: float = 0.9,
    b2: float = 0.95,
    weight_decay: float = 0.1,
    clip: float | None = 1.0,
    nesterov: bool = False,
) -> optax.GradientTransformation:
    """AdamW on the :func:`schedule`, decay on matrices only, the stage's gradient clipped;
    ``nesterov``: NAdamW (``optax.nadamw`` is ``optax.adamw`` with it)."""
    where = "nadamw" if nesterov else "adamw"
    check_range(peak, "peak", where, 0.0)
    _check_moments(where, weight_decay, clip, b1=b1, b2=b2)
    lr = schedule(peak, total_steps, warmup_steps=warmup_steps)
    tx = optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=_matrices, nesterov=nesterov)
    return _clipped(tx, clip)


def nadamw(
    peak: float, total_steps: int, *, b1: float = 0.99, **kw: Any
) -> optax.GradientTransformation:
    """NAdamW (AsyncPP's ``β1 = 0.99``): :func:`adamw` with ``nesterov=True``."""
    return adamw(peak, total_steps, b1=b1, nesterov=True, **kw)


def _muon_dims(exclude: Sequence[str]) -> Callable[[Any], Any]:
    """Muon's weight specs: the default (rows reduce, columns out) for every 2-D parameter
    whose path names none of ``exclude`` (:func:`_hidden_matrices`), None (AdamW) for the rest."""
    hidden = _hidden_matrices(exclude)

    def dims(params: Any) -> Any:
        return jax.tree.map(lambda h: contrib.MuonDimensionNumbers() if h else None, hidden(params))

    return dims


def _hidden_matrices(exclude: Sequence[str]) -> Callable[[Any], Any]:
    """The 2-D parameters whose path names none of ``exclude`` (Muon's and rotation's split)."""

    def mask(params: Any) -> Any:
        def one(path: Any, p: Any) -> bool:
            names = {str(getattr(k, "key", getattr(k, "name", k))) for k in path}
            return getattr(p, "ndim", 0) == 2 and not names & set(exclude)

        return jax.tree_util.tree_map_with_path(one, params)

    return mask


def muon_weights(params: Any, exclude: Sequence[str] = EXCLUDE) -> int:
    """How many parameters :func:`muon` orthogonalises in ``params``: the entries of its 2-D
    weights outside ``exclude`` (0: Muon would be AdamW on every parameter).

    Example:
        >>> import jax.numpy as jnp
        >>> muon_weights({"w": jnp.ones((3, 4)), "b": jnp.ones(4), "out": jnp.ones((4, 2))})
        12
    """
    specs = _muon_dims(exclude)(params)
    muon_leaf = lambda d: d is None or isinstance(d, contrib.MuonDimensionNumbers)
    flat = jax.tree.leaves(specs, is_leaf=muon_leaf)
    return sum(
        int(p.size) for p, d in zip(jax.tree.leaves(params), flat, strict=True) if d is not None
    )


def muon(
    peak: float,
    total_steps: int,
    *,
    adam_peak: float | None = None,
    warmup_steps: int = 0,
    beta: float = 0.95,
    b2: float = 0.95,
    weight_decay: float = 0.1,
    clip: float | None = 1.0,
    exclude: Sequence[str] = EXCLUDE,
) -> optax.GradientTransformation:
    """Muon on the hidden 2-D weights (rate ``peak``, momentum ``beta``), AdamW on the rest
    (rate ``adam_peak``, default ``peak / 10``), both on the :func:`schedule`."""
    check_range(peak, "peak", "muon", 0.0)
    _check_moments("muon", weight_decay, clip, beta=beta, b2=b2)
    if adam_peak is not None:
        check_range(adam_peak, "adam_peak", "muon", 0.0)
    lr = schedule(peak, total_steps, warmup_steps=warmup_steps)
    adam_lr = schedule(
        peak / 10 if adam_peak is None else adam_peak, total_steps, warmup_steps=warmup_steps
    )
    tx = contrib.muon(
        lr,
        beta=beta,
        weight_decay=weight_decay,
        adam_b2=b2,
        adam_weight_decay=weight_decay,
        adam_learning_rate=adam_lr,
        muon_weight_dimension_numbers=_muon_dims(exclude),
    )
    return _clipped(tx, clip)


def rotated(
    peak: float,
    total_steps: int,
    *,
    warmup_steps: int = 0,
    b1: float = 0.9,
    b2: float = 0.95,
    weight_decay: float = 0.1,
    clip: float | None = 1.0,
    frequency: int = 10,
    geometry: str = "bilateral",
    exclude: Sequence[str] = EXCLUDE,
) -> optax.GradientTransformation:
    """:func:`adamw` with Adam's scaling in a rotated basis on the hidden 2-D weights (basis
    rotation, :func:`jaxstale.transforms.basis_rotation.basis_rotation`; bases refreshed every
    ``frequency`` updates, ``geometry`` bilateral or unilateral); embeddings, head, biases and
    norms (``exclude`` and every non-matrix) run AdamW, as in the authors' code. The decay is
    on matrices only, as :func:`adamw`'s."""
    from jaxstale.transforms.basis_rotation import basis_rotation

    check_range(peak, "peak", "rotated", 0.0)
    _check_moments("rotated", weight_decay, clip, b1=b1, b2=b2)
    lr = schedule(peak, total_steps, warmup_steps=warmup_steps)
    tx = basis_rotation(
        lr, b1, b2, 1e-8, weight_decay, frequency=frequency, geometry=geometry,
        mask=_hidden_matrices(exclude), weight_decay_mask=_matrices,
    )  # fmt: skip
    return _clipped(tx, clip)


def sgd(
    peak: float,
    total_steps: int,
    *,
    warmup_steps: int = 0,
    momentum: float = 0.9,
    clip: float | None = 1.0,
) -> optax.GradientTransformation:
    """SGD with momentum on the :func:`schedule`, the stage's gradient clipped."""
    lr = schedule(peak, total_steps, warmup_steps=warmup_steps)
    return _clipped(optax.sgd(lr, momentum=momentum), clip)


#: the optimizers :func:`injected` builds by name
NAMES = ("adamw", "nadamw", "muon", "rotated")

#: warm-up of :func:`injected`: this fraction of the run's updates
WARMUP_FRACTION = 0.05


def _unit_peak(learning_rate: Any, *, name: str, steps: int, b1: float) -> Any:
    """``name`` on a schedule of peak 1, then scaled by ``learning_rate`` (the peak)."""
    warm = int(steps * WARMUP_FRACTION)
    if name == "muon":
        base = muon(1.0, steps, warmup_steps=warm, beta=b1)
    elif name == "rotated":
        base = rotated(1.0, steps, warmup_steps=warm, b1=b1)
    else:
        base = (nadamw if name == "nadamw" else adamw)(1.0, steps, warmup_steps=warm, b1=b1)
    return optax.chain(base, optax.scale(learning_rate))


def injected(
    name: str, learning_rate: float, *, steps: int, b1: float = 0.9
) -> optax.GradientTransformation:
    r"""``name`` (:data:`NAMES`) with its peak rate as an injected hyper-parameter
    ``"learning_rate"`` (:func:`optax.inject_hyperparams`), so that vmapped lanes of one
    compiled program can each train at their own rate: the optimizer on a :func:`schedule` of
    peak 1 (warm-up over :data:`WARMUP_FRACTION` of ``steps``, cosine decay to 0.1 at
    ``steps``), its update scaled by ``learning_rate``. Every rule here is linear in its rate
    (AdamW's decoupled decay is ``η_t·λ·θ``), so this is the optimizer at peak
    ``learning_rate`` to float32 rounding. ``b1``: Adam's β1 (NAdamW: AsyncPP's 0.99 when
    given so), Muon's momentum β; injected too (``"b1"``: per lane, or per stage with
    :func:`asyncpp_b1`).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = injected("adamw", 0.01, steps=100)
        >>> st = tx.init({"w": jnp.ones((2, 2))})
        >>> float(st.hyperparams["learning_rate"])
        0.01
    """
    if name not in NAMES:
        raise ValueError(f"unknown optimizer {name!r}; choose from: {', '.join(NAMES)}")
    if steps < 2:
        raise ValueError(f"injected: the schedule needs steps >= 2, got {steps}")
    make = optax.inject_hyperparams(_unit_peak, static_args=("name", "steps"))
    return make(learning_rate=learning_rate, name=name, steps=steps, b1=b1)


#: the optimizers of :func:`per_stage` in words (a table's heading)
LABELS = {
    "sgd": "SGD",
    "adam": "Adam",
    "nadam": "NAdam",
    "adamw": "AdamW",
    "nadamw": "NAdamW",
    "muon": "Muon",
    "rotated": "AdamW, basis rotation",
}


#: the names :func:`per_stage` takes (the experiments' ``--optimizer`` choices)
PER_STAGE: tuple[str, ...] = ("sgd", "adam", "nadam", *NAMES)


def per_stage(
    name: str, learning_rate: float, momentum: float, steps: int
) -> optax.GradientTransformation:
    """A pipeline stage's optimizer by name (:data:`LABELS`), its rate injected so that lanes
    can set their own: ``sgd`` (momentum ``momentum``), ``adam`` / ``nadam`` (optax's, β1
    ``momentum``, constant rate: the image experiments'), or one of :data:`NAMES` through
    :func:`injected` (β1 — Muon's β — ``momentum``, schedule over ``steps``)."""
    if name in NAMES:
        return injected(name, learning_rate, steps=steps, b1=momentum)
    if name == "adam":
        return optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate, b1=momentum)
    if name == "nadam":  # AsyncPP's optimizer: Adam with a Nesterov look-ahead (optax.nadam)
        return optax.inject_hyperparams(optax.nadam)(learning_rate=learning_rate, b1=momentum)
    if name == "sgd":
        return optax.inject_hyperparams(optax.sgd)(learning_rate=learning_rate, momentum=momentum)
    raise ValueError(f"unknown optimizer {name!r}; choose from: {', '.join(LABELS)}")


def asyncpp_b1(b1: float, num_stages: int) -> list[float]:
    r"""AsyncPP's adaptive momentum: stage :math:`s` of an ``N``-stage asynchronous 1F1B
    pipeline keeps :math:`v_s = N - s` weight versions and trains with

    .. math::

        \beta_{1,s} = \beta_1 + (v_s - 1)\,(0.99 - \beta_1) / N,

    so the stages whose gradients are the most stale average them over the longest horizon
    (the last stage, one version, keeps ``b1``).

    References:
        Ajanthan et al., "Nesterov Method for Asynchronous Pipeline Parallel Optimization",
        ICML 2025, arXiv 2505.01099; PluralisResearch/AsyncPP ``main_with_runtime.py``
        (``--adaptive_momentum``; ``num_versions`` = warm-up mini-batches + 1) at commit
        a6918030b92925ac3a48bb7c2fe69e42731a02ba.

    Example:
        >>> [round(b, 4) for b in asyncpp_b1(0.9, 4)]
        [0.9675, 0.945, 0.9225, 0.9]
    """
    if num_stages < 1 or not 0 <= b1 <= 0.99:
        raise ValueError(
            f"asyncpp_b1: need num_stages >= 1 and 0 <= b1 <= 0.99, got {num_stages}, {b1}"
        )
    return [b1 + (num_stages - s - 1) * (0.99 - b1) / num_stages for s in range(num_stages)]


def set_hyperparams(opt_state: Any, values: Mapping[str, Any]) -> Any:
    """``opt_state`` with the named hyper-parameters of an ``optax.inject_hyperparams`` optimizer
    replaced (float32 scalars, wherever they sit in the state).

    Raises:
        ValueError: a name the state does not hold.
    """
    for name, v in values.items():
        if not optax.tree_utils.tree_get_all_with_path(opt_state, name):
            raise ValueError(
                f"hyperparams: the optimizer state has no hyper-parameter {name!r}; build tx "
                "with optax.inject_hyperparams(...) to vary it per lane"
            )
        opt_state = optax.tree_utils.tree_set(opt_state, **{name: jnp.asarray(v, jnp.float32)})
    return opt_state
