"""Claims report: every published claim jaxstale tests, its verdict, and the evidence.

One row per claim (the papers' headlines): DC-ASGD vs ASGD vs SSGD, Gap-Aware
vs staleness-aware as M grows, DANA with momentum, LC-ASGD < DC-ASGD < ASGD, Async-BN vs
ordinary BN, SpecTrain / NAG vs vanilla vs stashing, the delay cliff, and the independent
simulations' acceptance check. Each is marked **held**, **held only when …** (it holds under
a condition the report names, e.g. at a fixed untuned learning rate or with raw inputs),
**within noise** (no difference beyond the 95 % interval of the per-seed paired difference)
or **did not hold** (the reverse, beyond noise), with the table and figure that show it.

Every number comes from the experiments' run folders, under the common protocol: standardised
inputs, validation split, each method at its own learning rate selected on validation, ≥ 5
seeds, paired per-seed differences with 95 % t intervals (a seed fixes the initial weights and
the data order for every method). Nothing is selected on test data. ::

    python -m experiments.claims --run           # run (or resume) every configuration, then
                                                 # write docs/claims.md and its figures
    python -m experiments.claims                 # re-write the report from existing folders
    python -m experiments.claims --run --quick   # smoke: tiny runs, the report says so

``make claims`` is the first line. The run folders live under ``--results`` (default
``results/claims``), one per configuration (:data:`RUNS`); a folder computed by other code is
refused, as for any experiment (re-run, or ``--force-resume``).
"""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxstale import runs

from .asynchronous import (
    judge_acceptance,
    judge_async_bn,
    judge_dana,
    judge_dc_asgd,
    judge_gap_aware,
    judge_lc_asgd,
    judge_moonshot_async,
)
from .configs import RUNS, Run
from .core import Claim, Context, Diff, Verdict, cell, chance_of, diff, selected, verdict_of
from .pipeline import judge_cliff, judge_moonshot_pipeline, judge_pipeline, judge_pipeline_adam

__all__ = [
    "CLAIMS",
    "RUNS",
    "Claim",
    "Context",
    "Diff",
    "Run",
    "Verdict",
    "cell",
    "chance_of",
    "diff",
    "judge_acceptance",
    "judge_async_bn",
    "judge_cliff",
    "judge_dana",
    "judge_dc_asgd",
    "judge_gap_aware",
    "judge_lc_asgd",
    "judge_moonshot_async",
    "judge_moonshot_pipeline",
    "judge_pipeline",
    "judge_pipeline_adam",
    "main",
    "report",
    "run_configs",
    "selected",
    "verdict_of",
]

EXPERIMENT = "claims"


CLAIMS: list[Claim] = [
    Claim(
        "C1",
        "DC-ASGD beats ASGD and SSGD",
        "Zheng et al., ICML 2017",
        "Delay compensation recovers the accuracy ASGD loses to stale gradients: at M = 4 and 8 "
        "(CIFAR-10, ResNet-20) DC-ASGD-a < DC-ASGD-c < SSGD < ASGD in test error.",
        ("async", "async-fixed-lr", "async-raw"),
        judge_dc_asgd,
    ),
    Claim(
        "C2",
        "Gap-Aware beats staleness-aware as M grows",
        "Barkai et al., ICLR 2020",
        "Penalising a gradient by its per-coordinate gap beats dividing it by its staleness, "
        "increasingly so with more workers.",
        ("async", "async-fixed-lr", "async-raw"),
        judge_gap_aware,
    ),
    Claim(
        "C3",
        "DANA tames momentum in ASGD",
        "Hakimi et al., 2019; Barkai et al., ICLR 2020",
        "With DANA's look-ahead, momentum helps asynchronous training instead of hurting it: "
        "DANA beats ASGD with momentum at many workers.",
        ("async", "async-momentum0"),
        judge_dana,
    ),
    Claim(
        "C4",
        "LC-ASGD < DC-ASGD < ASGD",
        "Li et al., ICPP 2020",
        "Loss compensation beats delay compensation, which beats plain ASGD (test error, M = 4, "
        "8, 16; CIFAR-10, ResNet-18).",
        ("async", "async-raw"),
        judge_lc_asgd,
    ),
    Claim(
        "A1",
        "Independent simulations' acceptance check",
        "issue 13",
        "Standardised digits, round-robin delays, momentum 0.9, lr 0.02 for every method, 1,500 "
        "updates: ASGD diverges at M = 16 while Gap-Aware and SA stay above 95 % and DC-ASGD-a "
        "above 90 %.",
        ("async-fixed-lr",),
        judge_acceptance,
    ),
    Claim(
        "C5",
        "Async-BN beats ordinary batch norm",
        "Li et al., ICPP 2020",
        "Merging the workers' batch statistics into the server's own running statistics gives "
        "lower test error than keeping the stale copies the workers push, the more so as M grows.",
        ("async-bn",),
        judge_async_bn,
    ),
    Claim(
        "P1",
        "SpecTrain / NAG prediction beats vanilla and stashing",
        "Chen et al. 2018 (SpecTrain); Harlap et al. 2018 (PipeDream)",
        "In an asynchronous 1F1B pipeline, predicting the weights a mini-batch will meet "
        "recovers the accuracy staleness costs: prediction beats vanilla (no stashing) and "
        "PipeDream's stashing, close to synchronous training.",
        ("pipeline",),
        judge_pipeline,
    ),
    Claim(
        "P2",
        "The delay cliff",
        "Jain et al., ICLR 2018 workshop",
        "With momentum SGD and every gradient d updates stale, the largest learning rate that "
        "still trains shrinks as d grows.",
        ("cliff",),
        judge_cliff,
    ),
    Claim(
        "P3",
        "Adam-aware prediction",
        "Guan et al. (XPipe / PipeOptim)",
        "Predicting with the inner optimizer's own last update (Ŵ = W + s·Δw_last) works for "
        "Adam as it does for momentum SGD: prediction beats vanilla with Adam per stage.",
        ("pipeline-adam",),
        judge_pipeline_adam,
    ),
    Claim(
        "M1",
        "Moonshot: 64 and 128 asynchronous workers",
        "issue 16",
        "Round-robin workers (τ = M − 1): the best method within 0.5 points of 1-worker SGD at "
        "M = 64 and within 1 point at M = 128, every method at its own rate, same updates.",
        ("async-m128",),
        judge_moonshot_async,
    ),
    Claim(
        "M2",
        "Moonshot: an 8-stage asynchronous pipeline",
        "issue 16",
        "Asynchronous 1F1B with N = 8: the best memory-light policy (at most two weight "
        "versions per stage) within 0.5 points of synchronous training.",
        ("pipeline-n8", "pipeline", "pipeline-nadam"),
        judge_moonshot_pipeline,
    ),
]


# ------------------------------------------------------------------------------------ report


def run_configs(names: Sequence[str], results: Path, quick: bool, force: bool) -> None:
    """Run (or resume) the named configurations into ``results/<name>``."""
    for name in names:
        spec = RUNS[name]
        config = dataclasses.replace(spec.at(quick), out=str(results / name), force_resume=force)
        print(f"[{EXPERIMENT}] {name}: {spec.command}{' (smoke)' if quick else ''}")
        spec.experiment.report(spec.experiment.run(config), config)


def report(ctx: Context, out: Path) -> str:
    """docs/claims.md's text (figures copied next to it, under ``claims/``)."""
    fig_dir = out.parent / "claims"
    lines = [
        "# Claims report",
        "",
        "<!-- generated by `python -m experiments.claims` (make claims); do not edit -->",
        "",
    ]
    if ctx.quick:
        lines += [
            "**Smoke report (--quick): tiny budgets, not results. Run `make claims` for the "
            "numbers.**",
            "",
        ]
    lines += [
        "Each published claim jaxstale tests, with its verdict on the embedded digits data "
        "under one protocol: inputs standardised with training statistics, a validation split "
        "carved from the training set, every method at its own learning rate **selected on "
        "validation accuracy**, at least 5 seeds, budgets at which the synchronous reference "
        "has converged. Cells are test accuracy %, mean ± 95 % CI over the seeds that trained, "
        "`[k/n div.]` the seeds that diverged, `@` the selected rate. A difference is "
        "**beyond noise** when the 95 % t interval of the per-seed paired difference (a seed "
        "fixes initial weights and data order for every method) excludes 0.",
        "",
        "Verdicts: **held**; **held only when …** (under a condition this report ran, e.g. one "
        "fixed untuned rate, or raw inputs); **within noise** (no difference beyond noise); "
        "**did not hold** (the reverse, beyond noise).",
        "",
        f"Generated {datetime.date.today().isoformat()} from the run folders in "
        f"`{ctx.results}` by `python -m experiments.claims`; the configurations:",
        "",
    ]
    for name, spec in RUNS.items():
        lines.append(f"- `{name}`: `{spec.command}` — {spec.what}")
    lines += ["", "## Summary", ""]
    verdicts: dict[str, Verdict] = {}
    for c in CLAIMS:
        missing = [n for n in c.runs[:1] if not ctx.has(n)]
        verdicts[c.id] = (
            Verdict("not run", f"missing run folder(s): {', '.join(missing)}")
            if missing
            else c.judge(ctx)
        )
    lines.append(
        runs.markdown_table(
            ["claim", "paper", "verdict"],
            [
                [
                    f'<a href="#{c.id.lower()}">{c.id}</a> {c.title}',
                    c.source,
                    f"**{verdicts[c.id].verdict}**",
                ]
                for c in CLAIMS
            ],
        )
    )
    for c in CLAIMS:
        v = verdicts[c.id]
        lines += [
            "",
            f'<a id="{c.id.lower()}"></a>',
            "",
            f"## {c.id}. {c.title}",
            "",
            f"*{c.source}.* {c.statement}",
            "",
            f"**Verdict: {v.verdict}.**",
            "",
            v.evidence,
        ]
        for t in v.tables:
            lines += ["", t]
        for run_name, stem in v.figures:
            src = ctx.path(run_name) / f"{stem}.png"
            if src.exists():
                fig_dir.mkdir(parents=True, exist_ok=True)
                dst = fig_dir / f"{run_name}-{stem}.png"
                shutil.copyfile(src, dst)
                lines += ["", f"![{c.id}: {stem}](claims/{dst.name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runs.OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="store_true", help="run (or resume) the configurations first")
    p.add_argument(
        "--quick", action="store_true", help="smoke configurations (about a minute each)"
    )
    p.add_argument(
        "--results",
        default=None,
        help="run folders (default results/claims, --quick: results/claims-quick)",
    )
    p.add_argument("--out", default="docs/claims.md", help="the report (default docs/claims.md)")
    p.add_argument(
        "--only",
        type=runs.name_list(list(RUNS), "configuration"),
        default=None,
        help="run only these configurations (comma-separated)",
    )
    p.add_argument("--force-resume", action="store_true", help="passed to every experiment")
    args = p.parse_args(argv)
    results = Path(args.results or ("results/claims-quick" if args.quick else "results/claims"))
    if not args.run:
        for flag, given in (("--only", args.only), ("--force-resume", args.force_resume)):
            if given:
                p.error(f"argument {flag}: applies with --run only (nothing would be run)")
        if not any(results.glob("**/summary.json")):
            p.error(
                f"no finished run under {results}: nothing to report (run with --run first, or "
                f"point --results at the run folders); {args.out} left as it is"
            )
    if args.run:
        run_configs(args.only or list(RUNS), results, args.quick, args.force_resume)
    ctx = Context(results, args.quick)
    out = Path(args.out)
    text = report(ctx, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_text(out, text)
    print(text)
    print(f"[{EXPERIMENT}] wrote {out}", file=sys.stderr)
    return {"text": text, "path": out}


if __name__ == "__main__":
    main()
