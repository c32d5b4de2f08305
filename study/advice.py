"""What a practitioner should do, per claim and per outcome, one sentence for each way the verdict
can point (issue 53: "a one-line answer a practitioner can act on").

Each claim has two sentences, one for each way its verdict can point: ``for`` (held, held with
reversals, a threshold met, a target reached) and ``against`` (did not hold, a target missed).
The headline prints the one its verdict selects; a verdict that makes no call (within noise,
suggestive, doubtful, untestable here) prints the mechanical answer of
:func:`study.headline.answer` instead, prefixed "no call". Nothing here reads a row: the
sentences are a claim's consequence in its own regime (the headline's regime column), not its
result, so a rerun that turns a verdict round turns the answer round with it.
"""

from __future__ import annotations

__all__ = ["ADVICE", "AGAINST", "FOR", "advice"]

#: verdict labels that point for the claim
FOR = frozenset({"held", "held with reversals", "reached"})
#: verdict labels that point against it
AGAINST = frozenset({"did not hold", "not reached"})

#: claim id → (for, against)
ADVICE: dict[str, tuple[str, str]] = {
    "C1": (
        "use DC-ASGD's adaptive compensation over plain ASGD",
        "plain ASGD at its own rate: DC-ASGD's compensation costs accuracy",
    ),
    "C2": (
        "as workers grow, prefer Gap-Aware's penalty to staleness-aware rates",
        "staleness-aware rates scale with M at least as well as Gap-Aware",
    ),
    "C3": (
        "with momentum and many workers, use DANA rather than momentum ASGD",
        "momentum ASGD at its own rate does as well as DANA",
    ),
    "C4": (
        "LC-ASGD's loss predictor is worth its cost over DC-ASGD",
        "DC-ASGD over LC-ASGD: the loss predictor does not pay",
    ),
    "A1": (
        "the simulator reproduces the published picture: trust its asynchronous verdicts",
        "the simulator misses a published threshold: read its verdicts with care",
    ),
    "C5": (
        "under asynchrony, keep Async-BN's statistics in batch norm",
        "ordinary batch norm does as well as Async-BN",
    ),
    "P1": (
        "in a deep SGD pipeline, predict the weights (SpecTrain) instead of stashing",
        "prediction hurts an SGD pipeline: vanilla or stashing at its own rate",
    ),
    "P2": (
        "lower the rate as the delay grows: the stable rate falls with it",
        "the stable rate did not fall with the delay: no need to retune for it",
    ),
    "P3": (
        "with Adam per stage, use Adam-aware prediction",
        "Adam-aware prediction hurts: vanilla with Adam at its own rate",
    ),
    "M1": (
        "64–128 asynchronous workers reach 1-worker accuracy with the best method",
        "no method reaches 1-worker SGD at 64–128 workers: fewer workers or synchronous",
    ),
    "M2": (
        "an 8-stage memory-light pipeline reaches synchronous accuracy",
        "no memory-light 8-stage policy reaches sync: flush or stash",
    ),
    "LM1": (
        "with AdamW each doubling of pipeline depth costs loss: keep it shallow or flush",
        "depth did not cost loss with AdamW: deeper pipelines are safe",
    ),
    "LM2": (
        "AsyncPP's NAdamW β1 rule is a drop-in for an 8-stage pipeline",
        "AsyncPP does not match sync at N = 8: keep a flush",
    ),
    "LM3": (
        "2BW is a safe default for an AdamW GPT pipeline",
        "2BW's one-step staleness costs > 0.05 nats with AdamW: flush if loss matters",
    ),
    "LM4": (
        "under a one-step delay, prefer Muon to AdamW",
        "AdamW tolerates a one-step delay as well as Muon",
    ),
    "LM5": (
        "with Muon under delay, add weight prediction",
        "weight prediction hurts Muon under delay: leave it out",
    ),
    "LM6": (
        "PipeMare can replace stashing and save its weight versions",
        "keep stashing: PipeMare loses more than 0.05 nats",
    ),
    "LM-M": (
        "a 16-stage memory-light GPT pipeline reaches sync",
        "no memory-light 16-stage GPT policy reaches sync: flush or stash",
    ),
    "LM7": (
        "under a one-step delay with AdamW, add error feedback",
        "error feedback does not recover AdamW's one-step gap: flush or Muon",
    ),
    "LM8": (
        "for deep Adam pipelines, run Adam in a rotated basis",
        "basis rotation's gap grows with depth as Adam's does: plain AdamW",
    ),
    "D1": (
        "DiLoCo at H = 50 can replace data parallelism at equal tokens",
        "DiLoCo at H = 50 loses more than a point to data parallelism: shorter H",
    ),
    "D2": (
        "do not run naive asynchronous outer Nesterov: synchronous DiLoCo or a delay-aware step",
        "naive asynchronous outer Nesterov does as well as synchronous DiLoCo",
    ),
    "D3": (
        "asynchronous DiLoCo: Delayed Nesterov with dynamic local updates",
        "Delayed Nesterov + dynamic local updates loses > 2 % to DiLoCo: stay synchronous",
    ),
    "D4": (
        "stream DiLoCo's fragments in FP4 with overlap",
        "FP4 streaming with overlap loses more than a point: more bits or less overlap",
    ),
    "D5": (
        "as staleness grows, an age-aware outer step (CGAD) rather than Nesterov",
        "outer Nesterov is as stable as the age-aware step",
    ),
    "D6": (
        "overlap DiLoCo's outer exchange with eager updates",
        "eager updates cost more than a point: exchange synchronously",
    ),
    "D7": (
        "asynchronous DiLoCo: add momentum look-ahead",
        "momentum look-ahead does not correct the staleness: leave it out",
    ),
    "RL1": (
        "a few updates stale: PPO-clip against the behaviour policy, not raw IS weights",
        "uncorrected importance sampling holds up as well as PPO-clip",
    ),
    "RL2": (
        "sequence-level IS under staleness: scale the step by the ESS (VCPO)",
        "VCPO's ESS-scaled step does not save sequence-level IS",
    ),
    "RL3": (
        "M2PO trains on rollouts as stale as the largest τ run",
        "M2PO falls behind on-policy at the largest τ: bound the staleness",
    ),
    "RL4": (
        "scale the learning rate by 1/τ as rollouts get staler",
        "the stable rate does not fall as 1/τ: no need to rescale it",
    ),
    "RL5": (
        "update the sampler's weights in flight rather than waiting τ versions",
        "in-flight updates do no better than off-by-τ",
    ),
}


def advice(claim: str, label: str, mechanical: str) -> str:
    """The headline's answer for a verdict ``label``: the claim's pre-written sentence for the
    way it points; ``mechanical`` (the primary's comparison in words) when it makes no call,
    prefixed "no call"; "–" for a claim not run. A held claim with a declared secondary
    against it says so."""
    if label == "not run":
        return "–"
    pair = ADVICE.get(claim)
    if pair is not None and label in FOR:
        return pair[0] + (" (a secondary reversed)" if label == "held with reversals" else "")
    if pair is not None and label in AGAINST:
        return pair[1]
    return mechanical if mechanical.startswith("no call") else f"no call: {mechanical}"
