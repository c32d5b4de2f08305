"""The claims report's protocol section: how every verdict below is reached (the header of
study/claims.md, defined once: the headline table and the sections use its labels)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from experiments.reports import MIN_PAIRS

from . import headline
from .core import Claim, Context, Verdict
from .decisions import LABELS
from .language import MARGIN
from .registry import CLAIMS
from .verdicts import ALPHA

__all__ = ["declared_line", "headline_lines", "protocol_lines"]


def headline_lines(ctx: Context, verdicts: Mapping[str, Verdict], link: str) -> list[str]:
    """The report's (and the README's) head: the headline table, what qualifies each
    verdict, and the practitioner's questions; ``link``: the report's path from where the
    lines are read ("" inside the report)."""
    notes = []
    for c in CLAIMS:  # a GPT's regime is the table's own column
        v = verdicts[c.id]
        got = [v.setup, *(x for x in v.caveat.split("; ") if not x.startswith("regime: "))]
        if any(got):
            notes.append(f"- **{c.id}**: {'; '.join(x for x in got if x)}")
    return [
        "## Headline",
        "",
        "One row a claim: the regime it was measured in, the primary comparison's effect "
        "(positive: the claimed direction) with its 95 % interval, the paper's effect rescaled "
        "to this task, the minimum detectable effect (80 % power) and the verdict, whose "
        f"labels are [defined under Protocol]({link}#verdicts); the answer is what to do in "
        "that regime, one sentence written for each way the verdict can point and chosen by it "
        "(`study/advice.py`), or says there is no call; each claim's section has its evidence.",
        "",
        headline.table(ctx, CLAIMS, verdicts, link),
        "",
        "What qualifies a verdict (set-up checks, whichever way they point; references not "
        "converged; primaries that are bounds; a GPT's regime):",
        "",
        *notes,
        "",
        "## Questions",
        "",
        "Each answer from the rows: every candidate at its own rate selected on validation, the "
        "best on validation named, the others' test gap to it paired by seed (positive: "
        "behind), `(edge)` / `(at chance)` where a selection is a bound.",
        "",
        *headline.questions(ctx),
    ]


def declared_line(claim: Claim) -> list[str]:
    """The claim's declared secondaries (corrected together), as its section prints them."""
    if not claim.secondaries:
        return []
    names = "; ".join(claim.secondaries)
    return ["", f"**Declared secondaries** (Holm over all of them; the rest exploratory): {names}."]


def protocol_lines(datasets: Sequence[str]) -> list[str]:
    """The protocol's paragraphs and the verdict labels' definitions, for rows of ``datasets``."""
    on = " and ".join(f"`{d}`" for d in datasets) or "no"
    return [
        f"Each published claim jaxstale tests, with its verdict on the {on} data "
        "under one protocol: inputs standardised with training statistics, a validation split "
        "carved from the training set, every method at its own learning rate **selected on "
        "validation accuracy** (a selection still at its grid's edge is listed under [Grid "
        "edges](#grid-edges)), at least 5 seeds, budgets at which the synchronous reference "
        "has converged ([Budget](#budget)). Cells are test accuracy %, mean ± 95 % CI over the "
        "seeds that trained, "
        "`[k/n div.]` the seeds that diverged, `@` the selected rate, `(edge)` when it is still "
        "the smallest or largest rate of its grid after the extensions, or no rate of the grid "
        "beats chance by 2 points (a comparison with that arm is then a bound, and a verdict "
        "whose primary reads one says **a bound**). A "
        "difference is "
        "**beyond noise** when the 95 % t interval of the per-seed paired difference (a seed "
        "fixes initial weights and data order for every method) excludes 0; where the rows "
        "carry each run's final test predictions, its standard error also counts the variance "
        "of resampling the test examples (every seed is scored on the same test set, so that "
        "part does not shrink with more seeds): se = √(sd²/n + Var_i(D_i)/N), D_i the mean "
        "over seeds of the two runs' difference on test example i.",
        "",
        "Each comparative claim names **one primary comparison** (printed before its numbers, "
        "declared in the code before any run was read) and the paper's effect rescaled to this "
        "task: the paper's relative test-error reduction applied to the reference arm's error "
        "here. Every other comparison is **secondary**, in three kinds. The claim's "
        "**declared secondaries** — a short list per claim, by the one rule that they are "
        "the primary's comparison at the paper's other conditions (worker counts, depths, H, "
        'delays), the claim\'s other named pair, or its trend for an "as M grows" claim (the '
        "per-seed slope of the paired difference against log2 M) — are corrected together "
        f"(Holm, family-wise {ALPHA:g}) and are the only ones that qualify a verdict; "
        "**exploratory** comparisons (one rate for every method, raw inputs, other "
        "protocols) are shown uncorrected and decide nothing; **set-up checks** (a "
        "configuration added after a run to test the set-up it ran under) are printed beside "
        "the verdict whichever way they point, and never change it. The declared lists were "
        "written on 2026-12-02 (issue 53), after the rows: the rule above chose them, not the "
        "rows. A one-rate condition is not used for a method that divides its step by "
        "the staleness or the gap (SA-ASGD, Gap-Aware). Differences are oriented so that "
        "positive is the claimed direction. A difference needs at least "
        f"{MIN_PAIRS} seeds trained in both runs to be beyond noise; the primary's "
        "**minimum detectable effect** (MDE: paired t, two-sided 5 %, 80 % power, "
        "(t₀.₉₇₅ + t₀.₈₀)·se) is printed beside the expected effect, and so is its "
        "**intention-to-treat** companion (a diverged seed scored at the task's chance level, "
        "1 / classes of the dataset, instead of being left out).",
        "",
        "The language-model claims (LM1–LM6, LM-M: a GPT on the embedded Shakespeare) read "
        "**test loss in nats per character** instead, lower is better, each arm at its peak "
        "rate selected on validation loss; a diverged seed scores log V, the uniform "
        "prediction's loss. Their papers report gaps in nats, so their expected effects are "
        "stated as is. A claim that a method *matches* a reference is a non-inferiority test "
        f"with a declared margin δ = {MARGIN:g} nats: `reference + δ − method` beyond noise "
        "above 0 (the method less than δ worse, one-sided 97.5 %). Its negative control — "
        "the same test on vanilla, which mitigates nothing — must fail it: where the control "
        "passes too, the test cannot tell the method from doing nothing and the claim is "
        "**untestable here (no assay sensitivity)** even where its primary passes.",
        "",
        '<a id="verdicts"></a>Verdicts:',
        "",
        *(f"- **{k}**: {v};" for k, v in LABELS.items()),
        "- **held** / **did not hold** for a threshold check (A1, P2): every threshold met / "
        "one missed;",
        "- **reached** / **not reached** for a moonshot (M1, M2, LM-M): the target met (the "
        "upper end of the gap's 95 % interval under it) / missed;",
        "- **not run**: the claim's run folder (or its primary comparison's cells) is missing, "
        "or the primary's arms are in two runs of different set-ups (the evidence says how they "
        "differ: a seed pairs across runs of one set-up only);",
        "- a verdict followed by **reference not converged at the budget of** a run rests on "
        "a configuration whose synchronous reference was still improving at its budget "
        "([Budget](#budget)): a gap to it may close with more updates;",
        "- a verdict followed by **on rows of an earlier configuration of** a run rests on rows "
        "that configuration produced before its settings changed in the code (listed below): "
        "it stands until the re-run replaces them.",
        "",
        "Under a claim, **speed** lines pair each arm's learning curve by seed as the verdict "
        "pairs its end point: the mean of the test metric over the run's evaluations (a "
        "normalised area under the curve) and its value at the last evaluation within a third "
        "of the budget (`study/speed.py`). Staleness can cost speed without "
        "costing the end point; these lines are not in the verdict.",
        "",
    ]
