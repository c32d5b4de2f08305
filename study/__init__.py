"""Claims report: every published claim jaxstale tests, its verdict, and the evidence.

One row per claim (the papers' headlines: :mod:`~study.registry`). Each comparative claim
declares, before any number is read,
one **primary** comparison and the paper's effect rescaled to this task (``Claim.primary``,
``Claim.expected``); every other comparison, trend ("as M grows") and condition (one rate,
raw inputs) is **secondary**: a short declared list (``Claim.secondaries``, corrected
together by Holm) qualifies the verdict, the rest is exploratory, set-up checks are printed
beside it. The verdict (:func:`~study.decisions.decide`) is **held**, **held with reversals**
(a declared secondary reversed, named), **suggestive** / **doubtful** (the primary within noise,
a declared secondary for / against the claim), **within noise** (nothing beyond noise though the
effect was detectable), **untestable here** (the primary's minimum detectable effect at 80 %
power exceeds the expected effect) or **did not hold** (the primary reversed); threshold checks
and moonshots read held / did not hold and reached / not reached.

Every number comes from the experiments' run folders, under the common protocol: standardised
inputs, validation split, each method at its own learning rate selected on validation, ≥ 5
seeds, paired per-seed differences with 95 % t intervals (a seed fixes the initial weights and
the data order for every method). Nothing is selected on test data. ::

    python -m study --run           # run (or resume) every configuration, then
                                                 # write study/claims.md and its figures
    python -m study                 # re-write the report from existing folders
                                                 # (from the committed rows when there are none)
    python -m study --from-rows     # rebuild it from the committed rows only
    python -m study --run --quick   # smoke: tiny runs, the report says so
    python -m study --pack          # commit-able copy of every run folder's cells
    python -m study --restore --run # resume a sweep from that copy

``make claims`` is the first line. The run folders live under ``--results`` (default
``results/claims``), one per configuration (:data:`RUNS`); a folder computed by other code is
refused, as for any experiment (re-run, or ``--force-resume``).

``results/`` is not committed: the report step first copies each configuration's small files
(``summary.json``, ``config.json``, ``table.md``) into ``study/claims/rows/<name>/`` (committed,
:mod:`~study.provenance`), then builds the report from that copy, so the report
rebuilds byte for byte from the repository (``--from-rows``). Its "Provenance" section records
the commit checked out when the rows were copied and each configuration's code fingerprint,
library versions and dataset digest; every comparative claim gets a forest plot of its paired
differences (:mod:`~study.figures`). A sweep longer than one machine's session
resumes on the next from its packed cells, committed in ``study/claims/cells/``
(:mod:`~study.cells`: every finished cell, unfinished configurations too).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from experiments import runs
from experiments.config import prog_of

from . import budget, cells, edges, provenance, rungs, sweeps
from . import readme as readme_mod
from .asynchronous import (
    judge_acceptance,
    judge_async_bn,
    judge_dana,
    judge_dc_asgd,
    judge_gap_aware,
    judge_lc_asgd,
    judge_moonshot_async,
)
from .configs import FAMILIES, RUNS, Run
from .core import (
    Claim,
    Context,
    Diff,
    Evidence,
    Verdict,
    cell,
    chance_of,
    diff,
    num_classes,
    selected,
    trend,
)
from .decisions import LABELS, Decision, decide
from .figures import copy_figure, forest_figure, save_png
from .language import regime
from .pipeline import judge_cliff, judge_moonshot_pipeline, judge_pipeline, judge_pipeline_adam
from .protocol import declared_line, headline_lines, protocol_lines
from .provenance import Snapshot
from .registry import CLAIMS, claim, expected_line

__all__ = [
    "CLAIMS",
    "LABELS",
    "RUNS",
    "Claim",
    "Context",
    "Decision",
    "Diff",
    "Evidence",
    "Run",
    "Snapshot",
    "Verdict",
    "assess_all",
    "cell",
    "chance_of",
    "claim",
    "decide",
    "diff",
    "forest_figure",
    "judge_acceptance",
    "judge_all",
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
    "num_classes",
    "report",
    "run_configs",
    "selected",
    "trend",
]

EXPERIMENT = "claims"

# ------------------------------------------------------------------------------------ report


#: updates between two checkpoints of a group of runs (``--checkpoint-every``; results do not
#: depend on it): a session that ends mid-group loses at most this many updates of its lanes
CHECKPOINT_EVERY = 500


def run_configs(names: Sequence[str], results: Path, quick: bool, force: bool) -> None:
    """Run (or resume) the named configurations into ``results/<name>``, each group of runs
    checkpointed every :data:`CHECKPOINT_EVERY` updates."""
    for name in names:
        spec = RUNS[name]
        out = str(results / name)
        config = spec.at(quick)
        # an experiment whose groups are minutes long (stale_rl) checkpoints none
        every = (
            {"checkpoint_every": CHECKPOINT_EVERY} if hasattr(config, "checkpoint_every") else {}
        )
        config = dataclasses.replace(config, out=out, force_resume=force, **every)
        print(f"[{EXPERIMENT}] {name}: {spec.command}{' (smoke)' if quick else ''}")
        spec.experiment.report(spec.experiment.run(config), config)


def _figure_links(
    c: Claim,
    v: Verdict,
    ev: Evidence | None,
    ctx: Context,
    fig_dir: Path,
    figures_from: Callable[[str], Path | None],
    write: bool = True,
) -> list[str]:
    """The claim's figures under ``fig_dir``: the experiments' (copied from the run folders
    under ``figures_from(configuration)``; None: the copy already beside the report) and the
    forest plot of its evidence ``ev`` (drawn unless ``write`` is False: the text only)."""
    lines = []
    forest = fig_dir / f"claim-{c.id.lower()}-forest.png"
    fig = forest_figure(c, ev, smoke=ctx.quick) if ev is not None and write else None
    if ev is not None and ev.primary is not None:  # forest_figure's condition for a figure
        if fig is not None:
            fig_dir.mkdir(parents=True, exist_ok=True)
            save_png(fig, forest)
        lines += [
            "",
            f"![{c.id}: every paired difference (forest plot: mean, 95 % interval, seeds, "
            f"expected effect)](claims/{forest.name})",
        ]
    elif forest.exists() and write:
        forest.unlink()
    for run_name, stem in v.figures:
        dst = copy_figure(run_name, stem, fig_dir, figures_from(run_name))
        if dst is not None:
            lines += ["", f"![{c.id}: {stem}](claims/{dst.name})"]
    return lines


def report(
    ctx: Context,
    out: Path,
    *,
    snap: Snapshot | None = None,
    figures_from: Path | None = None,
    refresh: Collection[str] | None = None,
    judged: tuple[dict[str, Verdict], dict[str, Evidence | None]] | None = None,
    figures: bool = True,
) -> str:
    """study/claims.md's text (figures written next to it, under ``claims/``).

    ``snap``: the committed rows ``ctx`` reads (:func:`provenance.snapshot`), recorded in the
    text; ``figures_from``: the run folders whose figures are copied beside the report (None:
    ``ctx``'s own folders without ``snap``, the copies already there with it); ``refresh``: the
    configurations whose figures are copied from there (None: every one; the others keep the
    copies already beside the report); ``judged``: :func:`judge_all`'s result for ``ctx``
    (computed here without it); ``figures`` False: the text only, the figures beside the report
    left as they are (the text is the same: a figure is linked where it would be drawn). Nothing
    in the
    text depends on the date or on where the rows were read: rebuilt from the same rows, the
    report is the same bytes."""
    fig_dir = out.parent / "claims"
    if snap is None and figures_from is None:
        figures_from = ctx.results

    def source(name: str) -> Path | None:
        return figures_from if refresh is None or name in refresh else None

    lines = [
        "# Claims report",
        "",
        "<!-- generated by `python -m study` (make claims); do not edit -->",
        "",
    ]
    if ctx.quick:
        lines += [
            "**Smoke report (--quick): tiny budgets, not results. Run `make claims` for the "
            "numbers.**",
            "",
        ]
    verdicts, evidence = judged if judged is not None else judge_all(ctx)
    lines += headline_lines(ctx, verdicts, "")
    names = sorted({d for n in RUNS if ctx.has(n) and (d := ctx.dataset(n)) is not None})
    lines += ["", "## Protocol", "", *protocol_lines(names), *_source_lines(ctx, out, snap), ""]
    for name, spec in RUNS.items():
        lines.append(f"- `{name}`: `{spec.command}` — {spec.what}" + _drift_note(ctx, name))
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
            f"**Primary comparison** (declared before the numbers): {c.primary}."
            + expected_line(c),
            *declared_line(c),
            "",
            f"**Verdict: {v.summary}.**",
            "",
            v.evidence,
        ]
        for t in v.tables:
            lines += ["", t]
        lines += _figure_links(c, v, evidence[c.id], ctx, fig_dir, source, figures)
    lines += sweeps.section(ctx, fig_dir, source, figures) + budget.section(ctx.results, list(RUNS))
    lines += edges.section(ctx.results, list(RUNS))
    folders = {n: ctx.path(n) for n in RUNS if ctx.has(n)}
    lines += ["", '<a id="provenance"></a>', ""]
    lines += provenance.section(folders, snap, _rows_link(out, snap), FAMILIES)
    return "\n".join(lines) + "\n"


def _rows_link(out: Path, snap: Snapshot | None) -> str | None:
    """The committed rows' folder relative to the report (posix), None without rows."""
    if snap is None:
        return None
    return Path(os.path.relpath(snap.rows, out.parent)).as_posix()


def _drifted(ctx: Context, name: str) -> list[str]:
    """How the configuration behind ``name``'s rows differs from the one the code declares now
    (:func:`provenance.drift`); empty when they are the same, or there are no rows."""
    if not ctx.has(name):
        return []
    return provenance.drift(RUNS[name].at(ctx.quick).resolved(), ctx.config(name))


def assess_all(ctx: Context) -> dict[str, Verdict]:
    """Every claim's verdict, by id (:func:`judge_all`'s first half)."""
    return judge_all(ctx)[0]


def judge_all(ctx: Context) -> tuple[dict[str, Verdict], dict[str, Evidence | None]]:
    """Every claim judged once: its verdict and its judge's evidence (None for a threshold
    check, a moonshot or a claim not run), by id. A claim resting on a configuration whose
    synchronous reference had not converged at its budget (:func:`budget.unconverged`), or on
    rows of an earlier configuration of one of its runs, says so in its caveat (the Summary and
    the README print it beside the verdict), so a verdict is never quoted as the protocol's
    while its budget falls short of it or its re-run is pending."""
    out, evidence = {}, {}
    # judged among every configuration: a longer run of a reference may be another claim's
    unconverged = budget.unconverged(ctx.results, [n for n in RUNS if ctx.has(n)])
    for c in CLAIMS:
        v, evidence[c.id] = c.judged(ctx)  # judged once for the text and the figures
        notes = []
        short = [n for n in c.runs if n in unconverged]
        if short and v.verdict != "not run":
            notes.append(f"reference not converged at the budget of {', '.join(short)}")
        old = [n for n in c.runs if _drifted(ctx, n)]
        if old and v.verdict != "not run":
            notes.append(f"on rows of an earlier configuration of {', '.join(old)}")
        read = rungs.run_read(ctx, c)
        lm = regime(ctx.rows(read)) if ctx.has(read) else ""  # a GPT's
        notes += [lm] if lm and v.verdict != "not run" else []
        if notes:
            v = dataclasses.replace(v, caveat="; ".join(x for x in (v.caveat, *notes) if x))
        out[c.id] = v
    return out, evidence


def _drift_note(ctx: Context, name: str) -> str:
    """A warning after a configuration whose rows a different configuration produced (the code's
    was changed since: :func:`provenance.drift`); empty otherwise."""
    changed = _drifted(ctx, name)
    if not changed:
        return ""
    return (
        f". **Its rows are from an earlier configuration** ({'; '.join(changed)}): every number "
        "below from this run is that configuration's until it is re-run"
    )


def _source_lines(ctx: Context, out: Path, snap: Snapshot | None) -> list[str]:
    if snap is None:
        return [
            f"Generated by `python -m study` from the run folders in "
            f"`{ctx.results}` (their fingerprints: [Provenance](#provenance)); the "
            "configurations:",
        ]
    return [
        f"Generated by `python -m study` from the rows committed in "
        f"`{_rows_link(out, snap)}/`, copied from the run folders in {snap.source_text()} (the "
        "commit and each configuration's fingerprint: [Provenance](#provenance)); the "
        "configurations:",
    ]


def _packing(p: runs.OneLineParser, args: Any, results: Path, cells_dir: Path) -> None:
    """``--pack`` (alone) or ``--restore`` (alone or before ``--run``), one line per
    configuration; refuses the flags either would leave unused."""
    names = args.only or list(RUNS)
    ignored = [("--from-rows", args.from_rows), ("--readme", args.readme)]
    ignored += [("--keep-rows", args.keep_rows)]
    if args.pack:
        ignored += [("--run", args.run), ("--restore", args.restore), ("--quick", args.quick)]
        ignored += [("--force-resume", args.force_resume)]
    elif not args.run:
        ignored += [("--quick", args.quick), ("--force-resume", args.force_resume)]
    for flag, given in ignored:
        if given:
            what = "--pack" if args.pack else "--restore without --run"
            p.error(f"argument {flag}: not with {what} (it would be ignored)")
    if args.pack:
        counts: dict[str, Any] = dict(cells.pack(results, cells_dir, names))
        verb, where = "packed", f"{results} -> {cells_dir}"
    else:
        if not cells_dir.is_dir():  # a typo restored nothing and exited 0 before
            p.error(f"argument --cells: {cells_dir} is not a folder of packed cells")
        try:
            want = {n: RUNS[n].config.resolved() for n in names}
            counts = dict(cells.restore(cells_dir, results, names, want))
        except cells.CellsError as e:
            p.error(f"argument --restore: {e}")
        verb, where = "restored", f"{cells_dir} -> {results}"
    for name, n in counts.items():
        if isinstance(n, cells.Restored):
            what = f"{n.written} cells" + (
                f", left out {n.other} archived cells of other code or configuration"
                if n.other
                else ""
            )
        else:
            what = f"{n[0]} new cells, {n[1]} in all"
        print(f"[{EXPERIMENT}] {name}: {verb} {what} ({where})", file=sys.stderr)
    if not counts:
        print(f"[{EXPERIMENT}] nothing {verb} ({where})", file=sys.stderr)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runs.OneLineParser(prog=prog_of(__name__), description=__doc__.splitlines()[0])
    p.add_argument("--run", action="store_true", help="run (or resume) the configurations first")
    p.add_argument(
        "--quick", action="store_true", help="smoke configurations (about a minute each)"
    )
    p.add_argument(
        "--results",
        default=None,
        help="run folders (default results/claims, --quick: results/claims-quick)",
    )
    p.add_argument("--out", default="study/claims.md", help="the report (default study/claims.md)")
    p.add_argument(
        "--rows",
        default=None,
        help="the committed copy of the rows (default: claims/rows beside --out)",
    )
    p.add_argument(
        "--from-rows",
        action="store_true",
        help="rebuild the report from the committed rows alone (no run folder read)",
    )
    p.add_argument(
        "--only",
        type=runs.name_list(list(RUNS), "configuration"),
        default=None,
        help="run only these configurations (comma-separated)",
    )
    p.add_argument("--force-resume", action="store_true", help="passed to every experiment")
    p.add_argument(
        "--keep-rows",
        action="store_true",
        help="a configuration not finished under --results keeps its committed rows and figure "
        "copies (a configuration finished in another session, whose run folders are gone, "
        "joins the report without the others being recomputed)",
    )
    p.add_argument(
        "--pack",
        action="store_true",
        help="only pack every run folder's finished cells (unfinished runs too) into --cells "
        "(committed: a sweep resumes from the repository), then stop",
    )
    p.add_argument(
        "--restore",
        action="store_true",
        help="first write the cells packed in --cells into the run folders (never over a file "
        "that exists); alone, or before --run",
    )
    p.add_argument(
        "--cells",
        default=None,
        help="the packed cells (default: claims/cells beside --out; study.cells)",
    )
    p.add_argument(
        "--readme",
        default=None,
        help="also rewrite this file's blocks from the report: the verdict lines between "
        "<!-- claims:start --> and <!-- claims:end -->, a claim's k-th table between "
        "<!-- claims:start C1.1 --> and <!-- claims:end C1.1 --> (study.readme)",
    )
    p.add_argument(
        "--text-only",
        action="store_true",
        help="write the text alone, leaving the figures beside the report as they are (the "
        "same text: a figure is linked where it would be drawn)",
    )
    args = p.parse_args(argv)
    if args.text_only and not args.from_rows:
        p.error("argument --text-only: only with --from-rows (figures copied from run folders "
                "decide the text)")  # fmt: skip
    readme = Path(args.readme) if args.readme else None
    if readme is not None:
        try:
            readme_mod.check(readme.read_text(), [c.id for c in CLAIMS])
        except (OSError, ValueError) as e:
            p.error(f"argument --readme: {readme}: {e}")
    out = Path(args.out)
    rows = Path(args.rows) if args.rows else out.parent / "claims" / "rows"
    source = args.results or ("results/claims-quick" if args.quick else "results/claims")
    results = Path(source)
    cells_dir = Path(args.cells) if args.cells else out.parent / "claims" / "cells"
    from_rows = bool(args.from_rows)
    if args.pack or args.restore:
        _packing(p, args, results, cells_dir)
        if args.pack or not args.run:
            return {"text": None, "path": None, "rows": None}
    elif args.cells is not None and not args.keep_rows:
        p.error("argument --cells: applies with --pack, --restore or --keep-rows only")
    if from_rows:
        for flag, given in (
            ("--run", args.run),
            ("--quick", args.quick),
            ("--results", args.results),
            ("--only", args.only),
            ("--force-resume", args.force_resume),
            ("--keep-rows", args.keep_rows),
        ):
            if given:
                p.error(f"argument {flag}: not with --from-rows (it reads the committed rows)")
    elif not args.run:
        for flag, given in (("--only", args.only), ("--force-resume", args.force_resume)):
            if given:
                p.error(f"argument {flag}: applies with --run only (nothing would be run)")
        # a configuration's folder may be a link to another worktree's (README): no glob,
        # whose "**" does not follow links
        finished = any((results / n / "summary.json").exists() for n in RUNS)
        if not finished and not any(results.glob("**/summary.json")):
            if args.results is None and provenance.read_index(rows) is not None:
                from_rows = True
                print(
                    f"[{EXPERIMENT}] no finished run under {results}: rebuilding {out} from the "
                    f"committed rows in {rows}",
                    file=sys.stderr,
                )
            else:
                p.error(
                    f"no finished run under {results}: nothing to report (run with --run first, "
                    f"or point --results at the run folders); {args.out} left as it is"
                )
    if args.keep_rows and not from_rows:  # before anything is run
        if problem := provenance.kept_kind_problem(rows, bool(args.quick)):
            p.error(f"argument --keep-rows: {problem}")
    done: list[str] = []  # the configurations whose rows and figures are copied now
    if from_rows:
        snap = provenance.read_index(rows)
        if snap is None:
            p.error(f"no committed rows in {rows} (no {provenance.INDEX}): run the report first")
    else:
        if args.run:
            run_configs(args.only or list(RUNS), results, args.quick, args.force_resume)
        done = [n for n in RUNS if (results / n / "summary.json").exists()]
        try:
            snap = provenance.snapshot(
                results, rows, list(RUNS), quick=args.quick, source=source, keep=args.keep_rows
            )
        except ValueError as e:
            p.error(f"argument --keep-rows: {e}")
        if args.keep_rows:  # kept rows copied before the speed readings: from the packed cells
            provenance.with_archived_curves(rows, cells_dir, [n for n in RUNS if n not in done])
    refresh = done if args.keep_rows else None
    ctx = Context(snap.rows, snap.quick)
    judged = judge_all(ctx)
    text = report(
        ctx, out, snap=snap, figures_from=None if from_rows else results, refresh=refresh,
        judged=judged, figures=not args.text_only,
    )  # fmt: skip
    new_readme = None
    if readme is not None:  # before the report is written: a block it cannot fill is an error
        link = Path(os.path.relpath(out.resolve(), readme.resolve().parent)).as_posix()
        filled = readme_mod.blocks(ctx, CLAIMS, judged[0], link)
        try:
            new_readme = readme_mod.rewrite(readme.read_text(), filled)
        except ValueError as e:
            p.error(f"argument --readme: {readme}: {e}")
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_text(out, text)
    if readme is not None and new_readme is not None:
        runs.atomic_write_text(readme, new_readme)
    print(text)
    print(f"[{EXPERIMENT}] wrote {out} (rows: {rows})", file=sys.stderr)
    return {"text": text, "path": out, "rows": rows}


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
