"""Pipeline schedules as data: which tick each pass runs at and which weight version it sees.

A pipeline of ``N`` stages trains on a stream of mini-batches ``b = 0, 1, …`` (each optionally cut
into ``M`` micro-batches). A :class:`Schedule` is the full timeline of that run, as numpy arrays, so
that the pipeline program compiler (:mod:`jaxstale.pipeline.program`) turns it, with a weight
policy, into the one program both executors run — the single-device emulator and the
``shard_map`` executor — and they can be tested against each other.

Tick semantics (both executors implement exactly this):

* Time is discrete. Every forward (F) and backward (B) pass takes one tick. At each tick each stage
  runs at most one op, given by ``table[tick, stage]`` (``IDLE = 0``, ``FORWARD = 1``,
  ``BACKWARD = 2``) with its mini-batch ``table_batch[tick, stage]`` and micro-batch
  ``table_micro[tick, stage]`` (``-1`` when idle).
* A pass reads its stage's weights as they are at the **start** of its tick.
* A stage's update is applied at the **end** of the tick of the backward that completes it:
  for asynchronous 1F1B every backward (one update per mini-batch per stage); for the flush
  schedules (GPipe, 1F1B-flush) the last backward of the mini-batch, the micro-batch gradients
  being averaged. ``update_tick[b, k]`` is that tick.
* Dependencies: F of ``(b, m)`` at stage ``k`` needs F of ``(b, m)`` at stage ``k-1`` at an
  earlier tick; B at stage ``k`` needs B at stage ``k+1`` at an earlier tick; B at the loss stage
  ``N-1`` needs its own F at an earlier tick (so the loss stage may run B right after its F).
* Each stage runs its ops in a fixed per-stage order (below) as early as the dependencies allow
  (a greedy list schedule); the tick table is the result.

Per-stage op orders:

* ``gpipe`` — per mini-batch: F of micro-batches ``0..M-1``, then B of ``M-1..0``; update at the
  last backward (GPipe, with a flush: no staleness).
* ``1f1b`` — asynchronous PipeDream 1F1B, no flush, ``M = 1``: stage ``k`` runs ``N - k`` forwards,
  then alternates B, F until the forwards run out, then the remaining backwards.
* ``1f1b-flush`` — PipeDream-Flush / DeepSpeed / Megatron: the same per mini-batch of ``M``
  micro-batches (``min(N - k, M)`` warm-up forwards, 1F1B steady state, cool-down backwards), the
  mini-batch's update at its last backward, then the next mini-batch.
* ``2bw`` — PipeDream-2BW: the 1F1B order over the whole stream of micro-batches (no flush), the
  update of mini-batch ``b`` at its last backward, every pass of ``b`` at the double-buffered
  version ``max(b - 1, 0)`` (:func:`pipedream_2bw`).

Versions and staleness. ``fwd_version[b, k]`` / ``bwd_version[b, k]`` is the weight version the
pass uses: the number of updates stage ``k`` applied before it (``update_tick < pass tick``) —
except on ``2bw``, whose passes use the older of two buffered versions; ``fwd_lag`` /
``bwd_lag`` (per micro-batch) count the updates applied before the pass beyond its version (0
on every other schedule). Two staleness-free targets:

* ``target_version[b, k] = b`` — the **sequential** target: what plain SGD would use for ``b``.
* ``roundtrip_target[b, k] = b + #{b' > b : update_tick[b', k] <= round-trip end of b}`` — the
  version at the end of ``b``'s round trip (the tick at which stage 0 finishes B of ``b``) without
  ``b``'s own update: the sequential target plus the updates of *later* mini-batches that stage
  ``k`` has already applied when ``b``'s gradient reaches the input. This is the SpecTrain lab's
  target (the SpecTrain lab's code).

A pass's staleness (its prediction horizon ``s``) is ``target - version``. For asynchronous 1F1B
in the steady state this gives, exactly,

* sequential target: forward ``s = N - 1 - k``, backward ``s = 0`` (PipeDream's staleness);
* round-trip target: forward ``s = ⌊k/2⌋ + N - k - 1``, backward ``s = ⌊k/2⌋`` — the SpecTrain
  lab's formula. Why ``⌊k/2⌋``: stage ``k`` runs B of ``b`` ``k`` ticks before stage 0 does and
  updates every 2 ticks, so it applies ``⌊k/2⌋`` later updates in the half-open window
  ``(its B of b, stage 0's B of b]``. Counting instead the version at the *start* of stage 0's
  backward tick would give ``⌈k/2⌉`` (a mismatch at odd ``k``): the lab's convention is the
  end-of-tick one, i.e. "all updates that have landed once the round trip is over".

During warm-up (``b < N - 1 - k``) and cool-down the horizons are smaller; the table has them
exactly, so use it rather than the closed forms.

Example:
    >>> from jaxstale import schedules
    >>> s = schedules.one_f_one_b(4, 8)
    >>> s.fwd_staleness[5].tolist(), s.bwd_staleness[5].tolist()
    ([3, 2, 1, 0], [0, 0, 0, 0])
    >>> f, b = s.horizons("roundtrip")
    >>> f[4].tolist(), b[4].tolist()
    ([3, 2, 2, 1], [0, 0, 1, 1])

References:
    Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019.
    Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
    NeurIPS 2019, arXiv:1811.06965.
    Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training" (PipeDream-2BW / Flush),
    ICML 2021, arXiv:2006.09503.
    Chen, Yang, Cheng, "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform" (SpecTrain), arXiv:1809.02839, 2018.
"""

from jaxstale.schedules.render import render as render
from jaxstale.schedules.render import render_text as render_text
from jaxstale.schedules.timeline import BACKWARD as BACKWARD
from jaxstale.schedules.timeline import FORWARD as FORWARD
from jaxstale.schedules.timeline import IDLE as IDLE
from jaxstale.schedules.timeline import SCHEDULES as SCHEDULES
from jaxstale.schedules.timeline import TARGETS as TARGETS
from jaxstale.schedules.timeline import Schedule as Schedule
from jaxstale.schedules.timeline import get as get
from jaxstale.schedules.timeline import gpipe as gpipe
from jaxstale.schedules.timeline import one_f_one_b as one_f_one_b
from jaxstale.schedules.timeline import one_f_one_b_flush as one_f_one_b_flush
from jaxstale.schedules.timeline import pipedream_2bw as pipedream_2bw
