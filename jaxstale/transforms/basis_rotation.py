r"""Basis rotation: Adam run in an approximate eigenbasis of each weight matrix's gradient
covariance, refreshed every ``k`` updates — the fix of asynchronous pipelines' staleness by
Jung, Shin and Lee (2026).

Their argument: a stale gradient hurts Adam most where its coordinates are poorly aligned with
the loss's curvature, because Adam's per-coordinate step is right only in an eigenbasis of the
Hessian. For a weight matrix :math:`W \in \mathbb{R}^{m\times n}` with gradient :math:`G` they
keep, as SOAP does, exponential averages of both one-sided covariances and their eigenbases,

.. math::

    L \leftarrow \beta_s L + (1-\beta_s)\,G G^\top, \qquad
    R \leftarrow \beta_s R + (1-\beta_s)\,G^\top G, \qquad
    \tilde G = Q_L^\top G\, Q_R,

and run Adam on :math:`\tilde G`: the first moment :math:`m` is kept in the original
coordinates (:math:`m \leftarrow \beta_1 m + (1-\beta_1) G`, rotated when used,
:math:`\tilde m = Q_L^\top m\, Q_R`), the second :math:`\tilde v` in the rotated ones
(:math:`\tilde v \leftarrow \beta_2 \tilde v + (1-\beta_2)\tilde G^{2}`), and the step is
rotated back,

.. math::

    U = Q_L \Bigl(\frac{\tilde m / (1-\beta_1^t)}{\sqrt{\tilde v/(1-\beta_2^t)} + \epsilon}\Bigr)
        Q_R^\top .

*Bilateral* rotation uses both :math:`Q_L` and :math:`Q_R`; *unilateral* only the smaller
side's (:math:`Q_L` when :math:`m < n`, else :math:`Q_R`), the other left as the identity.
The bases: at the first update the eigenvectors of :math:`L` and :math:`R` (``eigh``, by
decreasing eigenvalue), and that update only builds them (SOAP's rule: the matrix is not moved,
its moments stay zero, Adam's count starts at the second); every ``frequency`` updates after
that one step of power iteration
warm-started at the current basis — the columns sorted by :math:`\mathrm{diag}(Q^\top L Q)`,
:math:`\tilde v` permuted with them, then :math:`Q \leftarrow \mathrm{QR}(L\,Q)` — before that
update's Adam step. Parameters that are not matrices (and those ``mask`` leaves out) run plain
Adam.

**Checked against the authors' code** (LOG-postech/basis-rotation, read in the copy
joonkyoo/basis-rotation at a277112, ``optim/basis_rotation.py``): the covariance source
``"2nd"`` (the default) with :math:`\beta_s = \beta_2` (``shampoo_beta=-1``), ``eigh`` at the
first update, the QR refresh with the sort and the permutation of
:math:`\tilde v`, the moments' coordinates, :math:`\epsilon` added to the bias-corrected
:math:`\sqrt{\tilde v}` (optax's order; theirs divides :math:`\sqrt{\tilde v}` by
:math:`\sqrt{1-\beta_2^t}` first: the same to float rounding), unilateral's side. Their
training script passes :math:`\beta = (0.9, 0.999)`, frequency 10, weight decay 0.01 on every
parameter. Differences, ours: their code rotates only the attention and MLP linear weights
(embeddings, head, norms and biases run AdamW): pass ``mask`` to do the same; the defaults here
rotate every 2-D parameter. Their first update moves the matrices: its gradient, rotated into
the eigenbasis of its own covariance, is diagonal up to float32 rounding (~1e-7 of its norm),
and Adam's normalisation turns that rounding into steps of ±1·η in every off-diagonal
coordinate — a sign pattern that changes with the order of a sum, so the emulator and the mesh
(or two GPUs) part after one update; here that update only builds the bases, as SOAP's does.
Weight decay is decoupled, as optax's ``adamw`` (added to the
rotated-back step, then scaled by the rate), where theirs shrinks the weights before the step.

**Numerics.** Early in training a covariance averaged over fewer gradients than its side's
dimension (mini-batch gradients of lower rank) has a null space, whose eigenvectors float32
rounding would set (the authors add :math:`10^{-30} I`, which breaks no tie): a tie-break
:math:`\delta\,\bar\lambda\,\mathrm{diag}(1, 1 + 1/n, \dots, 2 - 1/n)` (:data:`TIE_BREAK`
:math:`\delta = 10^{-4}`, :math:`\bar\lambda` the mean eigenvalue) is added before ``eigh``
and the QR step, ours. Adam's step in those coordinates still normalises gradients that are
zero there up to rounding: two executors that round a sum differently part by ~1e-3 in the
loss within a few updates of a tiny model (``tests/test_families.py``; AdamW agrees to 1e-6).
The method is as well-posed as its covariances are.

With ``frequency=0`` the bases stay the identity and the rule is optax's Adam bit for bit
(:func:`basis_rotation` is then ``optax.adamw``): the rotations are exact multiplications by 0
and 1.

References:
    Jung, Shin, Lee, "Mitigating Staleness in Asynchronous Pipeline Parallelism via Basis
    Rotation", ICML 2026, arXiv:2602.03515 (P = 1 → 32 stages slows Adam 5.81×; in a rotated
    basis 76.8 % / 81.7 % fewer iterations than the best asynchronous baseline at 1B / 3B,
    P = 32); code: https://github.com/LOG-postech/basis-rotation.
    Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", ICLR 2025,
    arXiv:2409.11321 (the covariances, the eigenbasis and its QR refresh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxstale._checks import check_range, static_int
from jaxstale.transforms._utils import sparse_cond

__all__ = [
    "GEOMETRIES",
    "TIE_BREAK",
    "BasisRotationState",
    "basis_rotation",
    "scale_by_basis_rotation",
]

#: the rotations: both sides of a matrix, or its smaller side only
GEOMETRIES = ("bilateral", "unilateral")


class BasisRotationState(NamedTuple):
    """State of :func:`scale_by_basis_rotation`; the matrices of a leaf that is not rotated
    (or a side that is not) are empty ``(0, 0)`` arrays.

    Attributes:
        count: updates so far (``int32``).
        mu: the first moment, in the original coordinates.
        nu: the second moment, in the rotated coordinates.
        stats_l, stats_r: the averages of :math:`G G^\\top` and :math:`G^\\top G`.
        q_l, q_r: the bases :math:`Q_L`, :math:`Q_R` (the identity before the first update).
    """

    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax
    mu: optax.Updates
    nu: optax.Updates
    stats_l: optax.Updates
    stats_r: optax.Updates
    q_l: optax.Updates
    q_r: optax.Updates


def _sides(shape: tuple[int, ...], rotate: bool, geometry: str) -> tuple[bool, bool]:
    """Which sides of a leaf of ``shape`` are rotated: ``(left, right)``."""
    if not rotate or len(shape) != 2:
        return False, False
    if geometry == "bilateral":
        return True, True
    return (True, False) if shape[0] < shape[1] else (False, True)


#: the relative size of the tie-break added to a covariance before its eigenbasis is taken
TIE_BREAK = 1e-4


def _tie_break(s: jax.Array) -> jax.Array:
    """``s + δ·(tr s / n)·diag(1, 1 + 1/n, …, 2 − 1/n)``, ``δ`` = :data:`TIE_BREAK`: distinct
    eigenvalues where ``s`` has a null space, whose eigenvectors rounding would set."""
    n = s.shape[0]
    scale = TIE_BREAK * jnp.trace(s) / n
    return s + jnp.diag(scale * (1.0 + jnp.arange(n, dtype=s.dtype) / n))


def _eigh_desc(s: jax.Array) -> jax.Array:
    """The eigenvectors of the symmetric ``s`` (tie-broken, :func:`_tie_break`), by decreasing
    eigenvalue."""
    _, v = jnp.linalg.eigh(_tie_break(s))
    return v[:, ::-1]


def _rot(x: jax.Array, ql: jax.Array, qr: jax.Array, side: tuple[bool, bool]) -> jax.Array:
    r""":math:`Q_L^\top x\, Q_R` on the rotated sides."""
    x = ql.T @ x if side[0] else x
    return x @ qr if side[1] else x


def _back(x: jax.Array, ql: jax.Array, qr: jax.Array, side: tuple[bool, bool]) -> jax.Array:
    r""":math:`Q_L\, x\, Q_R^\top` on the rotated sides."""
    x = ql @ x if side[0] else x
    return x @ qr.T if side[1] else x


def _refresh(s: jax.Array, q: jax.Array, nu: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """One warm-started power-iteration step: sort ``q``'s columns by their Rayleigh quotients
    (``nu`` permuted along ``axis`` with them), then ``QR(s q)``."""
    s = _tie_break(s)
    order = jnp.argsort(-jnp.diagonal(q.T @ s @ q))
    q, nu = q[:, order], jnp.take(nu, order, axis=axis)
    return jnp.linalg.qr(s @ q)[0], nu


def scale_by_basis_rotation(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    frequency: int = 10,
    geometry: str = "bilateral",
    stats_decay: float | None = None,
    mask: Any = None,
) -> optax.GradientTransformation:
    r"""Adam's scaling in a rotated basis per weight matrix (module docstring), refreshed every
    ``frequency`` updates; the rate and the weight decay are :func:`basis_rotation`'s.

    Args:
        b1, b2, eps: Adam's.
        frequency: ``k ≥ 0``, updates between refreshes of the bases (the first at the first
            update); ``0``: never, the bases stay the identity (plain Adam, bit for bit).
        geometry: ``"bilateral"`` or ``"unilateral"`` (:data:`GEOMETRIES`).
        stats_decay: :math:`\beta_s` of the covariances (``None``: ``b2``, the authors').
        mask: a tree of bools like the parameters, or a function of the parameters returning
            one: the 2-D leaves to rotate (``None``: every 2-D leaf).

    Returns:
        An ``optax.GradientTransformation`` with a :class:`BasisRotationState`.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_basis_rotation(frequency=10, geometry="unilateral")
        >>> st = tx.init({"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)})
        >>> st.q_l["w"].shape, st.q_r["w"].shape, st.q_l["b"].shape  # 2 < 3: the left side
        ((2, 2), (0, 0), (0, 0))
        >>> u, st = tx.update({"w": jnp.ones((2, 3)), "b": jnp.ones(3)}, st)
        >>> float(abs(u["w"]).max()), float(u["b"][0])  # update 1 builds the basis only
        (0.0, 1.0)
    """
    name = "scale_by_basis_rotation"
    k = static_int(frequency, "frequency", name, 0)
    if geometry not in GEOMETRIES:
        raise ValueError(f"{name}: geometry must be one of {GEOMETRIES}, got {geometry!r}")
    check_range(b1, "b1", name, 0.0, 1.0)
    check_range(b2, "b2", name, 0.0, 1.0)
    check_range(eps, "eps", name, 0.0)
    bs = b2 if stats_decay is None else stats_decay
    check_range(bs, "stats_decay", name, 0.0, 1.0)

    def sides_tree(params: Any) -> Any:
        m = mask(params) if callable(mask) else mask
        if m is None:
            m = jax.tree.map(lambda _: True, params)
        return jax.tree.map(lambda p, r: _sides(jnp.shape(p), bool(r), geometry), params, m)

    def init_fn(params: optax.Params) -> BasisRotationState:
        sides = sides_tree(params)
        empty = lambda p: jnp.zeros((0, 0), jnp.result_type(p))

        def mats(fill: Callable[[int, Any], jax.Array], side: int) -> Any:
            return jax.tree.map(
                lambda p, s: fill(p.shape[side], p.dtype) if s[side] else empty(p),
                params,
                sides,
            )

        zeros = lambda n, dt: jnp.zeros((n, n), dt)
        eye = lambda n, dt: jnp.eye(n, dtype=dt)
        return BasisRotationState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params),
            nu=optax.tree.zeros_like(params),
            stats_l=mats(zeros, 0),
            stats_r=mats(zeros, 1),
            q_l=mats(eye, 0),
            q_r=mats(eye, 1),
        )

    def update_fn(
        updates: optax.Updates, state: BasisRotationState, params: optax.Params | None = None
    ) -> tuple[optax.Updates, BasisRotationState]:
        del params
        count = optax.safe_increment(state.count)
        sides = sides_tree(updates)

        mu = optax.tree.update_moment(updates, state.mu, b1, 1)

        def rotate(g, nu, sl, sr, ql, qr, side):
            """The leaf's covariances and bases after this gradient; ``nu`` permuted with a
            refreshed basis; the rotated gradient."""
            left, right = side
            if not (left or right):
                return g, nu, sl, sr, ql, qr
            if left:
                sl = (1 - bs) * (g @ g.T) + bs * sl
            if right:
                sr = (1 - bs) * (g.T @ g) + bs * sr
            if k:  # sparse_cond: under vmap (lanes) the refreshes run only when they are due

                def first(ops: tuple) -> tuple:
                    sl, sr, ql, qr, nu = ops
                    ql = _eigh_desc(sl) if left else ql
                    return sl, sr, ql, _eigh_desc(sr) if right else qr, nu

                def later(ops: tuple) -> tuple:
                    sl, sr, ql, qr, nu = ops
                    if left:
                        ql, nu = _refresh(sl, ql, nu, 0)
                    if right:
                        qr, nu = _refresh(sr, qr, nu, 1)
                    return sl, sr, ql, qr, nu

                ops = sparse_cond(count == 1, first, (sl, sr, ql, qr, nu))
                ops = sparse_cond((count > 1) & (count % k == 0), later, ops)
                sl, sr, ql, qr, nu = ops
            return _rot(g, ql, qr, side), nu, sl, sr, ql, qr

        out = jax.tree.map(
            rotate, updates, state.nu, state.stats_l, state.stats_r, state.q_l, state.q_r, sides
        )
        treedef = jax.tree.structure(updates)
        cols = list(zip(*treedef.flatten_up_to(out), strict=True))
        g_rot, nu, sl, sr, ql, qr = (treedef.unflatten(c) for c in cols)
        # Adam in the rotated coordinates, with optax's own tree functions and arithmetic (so
        # that identity bases give optax's Adam to the bit)
        nu = optax.tree.update_moment_per_elem_norm(g_rot, nu, b2, 2)
        mu_rot = jax.tree.map(_rot, mu, ql, qr, sides)
        mu_hat = optax.tree.bias_correction(mu_rot, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        if k:  # a rotated matrix's first gradient only builds its basis: Adam counts from 2
            adam_count = jnp.maximum(count - 1, 1)
            on = lambda rotated, plain: jax.tree.map(
                lambda a, b, side: a if any(side) else b, rotated, plain, sides
            )
            mu_hat = on(optax.tree.bias_correction(mu_rot, b1, adam_count), mu_hat)
            nu_hat = on(optax.tree.bias_correction(nu, b2, adam_count), nu_hat)
        step = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + 0.0) + eps), mu_hat, nu_hat)
        step = jax.tree.map(_back, step, ql, qr, sides)
        if k:
            first = count == 1
            skip = lambda new, old, side: jnp.where(first, old, new) if any(side) else new
            step = jax.tree.map(lambda u, side: skip(u, jnp.zeros_like(u), side), step, sides)
            mu = jax.tree.map(skip, mu, state.mu, sides)
            nu = jax.tree.map(skip, nu, state.nu, sides)
        return step, BasisRotationState(count, mu, nu, sl, sr, ql, qr)

    return optax.GradientTransformation(init_fn, update_fn)


def basis_rotation(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    *,
    frequency: int = 10,
    geometry: str = "bilateral",
    stats_decay: float | None = None,
    mask: Any = None,
    weight_decay_mask: Any = None,
) -> optax.GradientTransformation:
    r"""AdamW in a rotated, approximately Hessian-eigen basis per weight matrix (Jung, Shin, Lee
    2026): ``optax.chain(scale_by_basis_rotation(...), add_decayed_weights(weight_decay),
    scale_by_learning_rate(learning_rate))``, ``optax.adamw``'s chain with Adam's scaling
    rotated (module docstring).

    ``frequency=0`` is ``optax.adamw`` with the same arguments, bit for bit.

    Args:
        learning_rate: the rate (or schedule).
        b1, b2, eps: Adam's.
        weight_decay: decoupled, as ``optax.adamw``'s (``weight_decay_mask``: its ``mask``).
        frequency, geometry, stats_decay, mask: :func:`scale_by_basis_rotation`'s.

    Returns:
        An ``optax.GradientTransformation``.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> params = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]]), "b": jnp.zeros(2)}
        >>> grads = {"w": jnp.array([[0.1, -0.2], [0.3, 0.05]]), "b": jnp.ones(2)}
        >>> tx = basis_rotation(0.1, frequency=0)  # no rotation: AdamW
        >>> u, _ = tx.update(grads, tx.init(params), params)
        >>> ref = optax.adamw(0.1, weight_decay=0.0)
        >>> v, _ = ref.update(grads, ref.init(params), params)
        >>> bool(jnp.all(u["w"] == v["w"]))
        True

    References:
        Jung, Shin, Lee, ICML 2026, arXiv:2602.03515 (module docstring).
    """
    if not callable(learning_rate):
        check_range(learning_rate, "learning_rate", "basis_rotation", 0.0)
    check_range(weight_decay, "weight_decay", "basis_rotation", 0.0)
    return optax.chain(
        scale_by_basis_rotation(
            b1, b2, eps, frequency=frequency, geometry=geometry, stats_decay=stats_decay, mask=mask
        ),
        optax.add_decayed_weights(weight_decay, weight_decay_mask),
        optax.scale_by_learning_rate(learning_rate),
    )
