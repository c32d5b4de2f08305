"""The asynchronous data-parallel claims: DC-ASGD, Gap-Aware, DANA, LC-ASGD, Async-BN, the
acceptance check and the 64/128-worker moonshot."""

from __future__ import annotations

from jaxstale import runs

from .. import async_bn
from .core import (
    Context,
    Diff,
    Verdict,
    _async_table,
    _at_sync_rate,
    _best,
    _conditional,
    _evidence,
    _methods_of,
    _ordering,
    _target,
    cell,
    chance_of,
    diff,
    selected,
)


def judge_dc_asgd(ctx: Context) -> Verdict:
    workers = [w for w in (4, 8) if w in ctx.config("async")["workers"]]
    pairs = [("dc-asgd-a", "asgd"), ("dc-asgd-a", "ssgd"), ("dc-asgd-c", "asgd")]
    main = _ordering(ctx, "async", pairs, workers)
    label, at_sync = _at_sync_rate(ctx, "async", pairs[:2], ctx.config("async")["workers"])
    cond = {
        label: at_sync,
        "one fixed rate (0.02), round-robin, M = 16": _conditional(
            ctx, "async-fixed-lr", lambda: _ordering(ctx, "async-fixed-lr", [pairs[0]], [16])
        ),
        "raw inputs, M = 16, 32": _conditional(
            ctx, "async-raw", lambda: _ordering(ctx, "async-raw", [pairs[0]], [16, 32])
        ),
    }
    v, ev = _evidence(main, cond)
    table = _async_table(
        ctx,
        "async",
        ["sgd", "ssgd", "asgd", "dc-asgd-c", "dc-asgd-a"],
        ctx.config("async")["workers"],
    )
    return Verdict(v, ev, [table], [("async", "accuracy_vs_workers")])


def judge_gap_aware(ctx: Context) -> Verdict:
    cfgw = ctx.config("async")["workers"]
    big = [w for w in cfgw if w >= 16] or cfgw[-1:]
    main = _ordering(ctx, "async", [("gap-aware", "sa-asgd")], big)
    label, at_sync = _at_sync_rate(ctx, "async", [("gap-aware", "sa-asgd")], big)
    cond = {
        label: at_sync,
        "one fixed rate (0.02), round-robin, M = 16": _conditional(
            ctx,
            "async-fixed-lr",
            lambda: _ordering(ctx, "async-fixed-lr", [("gap-aware", "sa-asgd")], [16]),
        ),
        "raw inputs": _conditional(
            ctx,
            "async-raw",
            lambda: _ordering(ctx, "async-raw", [("gap-aware", "sa-asgd")], [16, 32]),
        ),
    }
    v, ev = _evidence(main, cond)
    table = _async_table(ctx, "async", ["sgd", "asgd", "sa-asgd", "gap-aware"], cfgw)
    return Verdict(v, ev, [table], [("async", "accuracy_vs_workers")])


def judge_dana(ctx: Context) -> Verdict:
    cfgw = ctx.config("async")["workers"]
    big = [w for w in cfgw if w >= 16] or cfgw[-1:]
    main = _ordering(ctx, "async", [("dana", "asgd")], big)
    label, at_sync = _at_sync_rate(ctx, "async", [("dana", "asgd")], big)
    cond: dict[str, list[Diff] | None] = {label: at_sync}
    if ctx.has("async-momentum0"):
        # momentum helps with DANA: DANA at μ = 0.9 vs DANA at μ = 0 (paired by seed)
        r9 = [r for r in ctx.rows("async") if r["momentum"] == 0.9]
        r0 = ctx.rows("async-momentum0")
        ds = []
        for w in big:
            a, b = selected(r9, method="dana", workers=w), selected(r0, method="dana", workers=w)
            if a and b:
                ds.append(diff(a, b, f"dana μ=0.9 (M={w})", f"dana μ=0 (M={w})"))
        cond["momentum helps DANA (μ = 0.9 vs 0)"] = ds
    v, ev = _evidence(main, cond)
    table = _async_table(ctx, "async", ["sgd", "asgd", "dana", "dana-dc"], cfgw)
    tables = [table]
    if ctx.has("async-momentum0"):
        tables.append(
            "Without momentum (rate grid ×10):\n\n"
            + _async_table(ctx, "async-momentum0", ["sgd", "asgd", "gap-aware", "dana"], big, 0.0)
        )
    return Verdict(v, ev, tables, [("async", "accuracy_vs_workers")])


def judge_lc_asgd(ctx: Context) -> Verdict:
    cfgw = ctx.config("async")["workers"]
    pairs = [("lc-asgd", "dc-asgd-a"), ("dc-asgd-a", "asgd")]
    main = _ordering(ctx, "async", pairs, [w for w in cfgw if w in (4, 8, 16)] or cfgw)
    label, at_sync = _at_sync_rate(ctx, "async", pairs, [w for w in cfgw if w >= 8] or cfgw)
    cond = {
        label: at_sync,
        "raw inputs, M = 16, 32": _conditional(
            ctx, "async-raw", lambda: _ordering(ctx, "async-raw", pairs, [16, 32])
        ),
    }
    v, ev = _evidence(main, cond)
    rows = [r for r in ctx.rows("async") if r["method"] == "lc-asgd"]
    lams = sorted({r["lam"] for r in rows if r.get("lam") is not None})
    sel = [selected(rows, method="lc-asgd", workers=w) for w in cfgw]
    picked = ", ".join(f"M={w}: λ {s[0]['lam']:+g}" for w, s in zip(cfgw, sel, strict=True) if s)
    ev += f"\n- LC-ASGD's λ tuned on validation over {lams} (sign included): {picked}"
    table = _async_table(ctx, "async", ["sgd", "asgd", "dc-asgd-a", "lc-asgd"], cfgw)
    return Verdict(v, ev, [table], [("async", "accuracy_vs_workers")])


def judge_acceptance(ctx: Context) -> Verdict:
    if not ctx.has("async-fixed-lr"):
        return Verdict("not run", "run `python -m experiments.claims --run`")
    rows = ctx.rows("async-fixed-lr")
    m = 16 if any(r["workers"] == 16 for r in rows) else max(r["workers"] for r in rows)
    got = {
        meth: [r for r in rows if r["method"] == meth and r["workers"] == m]
        for meth in ("asgd", "gap-aware", "sa-asgd", "dc-asgd-a")
    }

    def mean(rs: list[dict]) -> float:
        vals = [r["final_test_accuracy"] for r in rs if not r["diverged"]]
        return sum(vals) / len(vals) if vals else 0.0

    collapsed = [r["diverged"] or (r["final_test_accuracy"] or 0) < 0.2 for r in got["asgd"]]
    checks = [
        (f"ASGD diverges or collapses to chance at M={m}", all(collapsed)),
        ("Gap-Aware > 95 %", mean(got["gap-aware"]) > 0.95),
        ("SA-ASGD > 95 %", mean(got["sa-asgd"]) > 0.95),
        ("DC-ASGD-a > 90 %", mean(got["dc-asgd-a"]) > 0.90),
    ]
    v = "held" if all(ok for _, ok in checks) else "did not hold"
    ev = "\n".join(f"- {label}: {'yes' if ok else 'no'}" for label, ok in checks)
    ndiv = sum(r["diverged"] for r in got["asgd"])
    ev += (
        f"\n- ASGD: {ndiv}/{len(got['asgd'])} seeds with a non-finite loss, the others at "
        f"{100 * mean(got['asgd']):.1f} % (chance is 10 %)"
    )
    table = runs.markdown_table(
        ["method", f"M={m}"],
        [[meth, cell(rs)] for meth, rs in got.items()],
    )
    return Verdict(v, ev, [table])


def judge_async_bn(ctx: Context) -> Verdict:
    exp = async_bn
    prow = exp.policy_rows(ctx.rows("async-bn"))
    sel = exp.select(prow, chance_of(prow))
    ms = sorted(sel["lr"])
    main, body = [], []
    pick = {}
    for m in ms:
        at_m = exp.selected_rows(prow, sel, m)
        for q in (exp.ORDINARY, exp.ASYNC):
            pick[(q, m)] = at_m[f"{q} tuned"]
        pick[(exp.RECOMPUTED, m)] = at_m[exp.RECOMPUTED]
        if m >= 8 and pick[(exp.ASYNC, m)] and pick[(exp.ORDINARY, m)]:
            main.append(
                diff(pick[(exp.ASYNC, m)], pick[(exp.ORDINARY, m)], f"async-bn (M={m})",
                     f"ordinary BN (M={m})")
            )  # fmt: skip
    v, ev = _evidence(main, {})
    ev += "\n- accuracy with the statistics recomputed on the training set at the final weights "
    ev += "(the bound any running-statistics policy approximates) in the table's last row"
    for q in (exp.ORDINARY, exp.ASYNC, exp.RECOMPUTED):
        body.append([q, *(cell(pick[(q, m)]) for m in ms)])
    table = runs.markdown_table(["statistics", *(f"M={m}" for m in ms)], body)
    return Verdict(v, ev, [table], [("async-bn", "plot")])


def judge_moonshot_async(ctx: Context) -> Verdict:
    rows = ctx.rows("async-m128")
    ms = sorted({r["workers"] for r in rows if r["workers"] > 1})
    methods = [m for m in _methods_of(ctx, "async-m128", rows) if m != "sgd"]
    ref = selected(rows, method="sgd", workers=1)
    oks, ev = [], []
    for m in ms:
        target = 0.5 if m <= 64 else 1.0
        best = _best(rows, methods, workers=m)
        if not best or not ref:
            continue
        ok, lines, names = _target(best, ref, f"M={m}", "1-worker SGD", target)
        oks.append(ok)
        ev += [f"- M = {m}: {line}" for line in lines]
        for meth in methods:
            pick = selected(rows, method=meth, workers=m)
            if pick and meth not in names:
                ev.append(f"  - {diff(ref, pick, '1-worker SGD', f'{meth} (M={m})').text()}")
    v = "reached" if oks and all(oks) else ("not run" if not oks else "not reached")
    table = _async_table(ctx, "async-m128", ["sgd", *methods], ms)
    figs = [("async-m128", "accuracy_vs_workers"), ("async-m128", "plot")]
    return Verdict(v, "\n".join(ev), [table], figs)
