"""study: the report's committed rows (rebuilt byte for byte from them, without
the run folders), its Provenance section, and the forest plot per claim, on hand-built run
folders."""

import dataclasses
import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib.figure import Figure

import study as claims
from experiments.runs import fingerprint
from study import budget, figures, provenance, sweeps
from study.configs import FAMILIES
from study.verdicts import Diff
from tests.study.budget_facts import fact as _budget_fact

BASE = [0.90, 0.91, 0.905, 0.895, 0.90]
NOISE = [0.0005, -0.0005, 0.001, -0.001, 0.0]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
VERSIONS = {"jax": "0.4.35", "jaxlib": "0.4.35", "flax": "0.10.2", "optax": "0.2.4",
            "numpy": "2.1.0", "python": "3.12.1"}  # fmt: skip


def _rows(accs, lr=0.01, mu=0.9):
    return [
        {"method": m, "workers": w, "momentum": mu, "lr": lr, "lam": None, "seed": s,
         "diverged": v is None, "final_val_accuracy": v, "final_test_accuracy": v,
         "staleness_counts": [1, 2, 3]}
        for (m, w), vals in accs.items() for s, v in enumerate(vals)
    ]  # fmt: skip


def _async(ms=(4, 8, 16, 32)):
    """C1's default run: DC-ASGD-a 2 points above ASGD, SSGD and DC-ASGD-c level with it."""
    accs = {("sgd", 1): [b + 0.05 for b in BASE]}
    for m in ms:
        accs[("asgd", m)] = BASE
        accs[("dc-asgd-a", m)] = [b + 0.02 + n for b, n in zip(BASE, NOISE, strict=True)]
        accs[("ssgd", m)] = [b + n for b, n in zip(BASE, NOISE, strict=True)]
        accs[("dc-asgd-c", m)] = [b + n for b, n in zip(BASE, NOISE, strict=True)]
    return accs


def _code(**over):
    return {"jaxstale": "0.1.0", "source_sha": "s" * 64, "experiment_sha": "e" * 64,
            "user_sha": None, "data_sha": "d" * 64, "versions": dict(VERSIONS),
            "git_commit": COMMIT, "hash": "feedfacecafebeef", **over}  # fmt: skip


def _folder(root, name, rows, workers, code=None, header=None, figs=()):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"experiment": "x", "rows": rows}, indent=2))
    cfg = {"workers": workers, "dataset": "digits", "quick": False}
    head = {"experiment": "x", "run_id": "r", "config": cfg, "code": code or _code()}
    (d / "config.json").write_text(json.dumps({**head, **(header or {})}, indent=2))
    (d / "table.md").write_text(f"| {name} |\n")
    (d / "metrics.jsonl").write_text('{"step": 1}\n' * 100)
    for stem in figs:
        fig = Figure(figsize=(2, 2))
        fig.subplots().plot([0, 1], [0, 1])
        fig.savefig(d / f"{stem}.png")
    return d


def _worse(accs, k=0.1):
    """The same cells at a second, worse rate (0.1; one ASGD seed diverged)."""
    out = {key: [a - k for a in vals] for key, vals in accs.items()}
    out[("asgd", 32)] = [None, *out[("asgd", 32)][1:]]
    return out


def _results(root):
    res = root / "results" / "claims"
    rows = _rows(_async()) + _rows(_worse(_async()), lr=0.1)
    _folder(res, "async", rows, [4, 8, 16, 32], figs=("accuracy_vs_workers", "plot"))
    raw = _rows({("asgd", 16): BASE, ("dc-asgd-a", 16): [b - 0.03 for b in BASE]})
    _folder(res, "async-raw", raw, [16, 32], code=_code(git_commit="f" * 40, hash="0" * 16),
            header={"force_resumed": [{"time": "t", "reused_cells": 4, "from": ["a"],
                                       "to": "0" * 16, "changed": ["jax"]}]})  # fmt: skip
    return res


@pytest.mark.slow  # 7 s; the smoke-report rebuild below stays in make test
def test_report_rebuilds_from_the_committed_rows_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _results(tmp_path)
    out, readme = tmp_path / "docs" / "claims.md", tmp_path / "README.md"
    readme.write_text("intro\n<!-- claims:start -->\n- old line\n<!-- claims:end -->\nrest\n")
    got = claims.main(["--results", str(res), "--out", str(out), "--readme", str(readme)])
    text, rows = out.read_bytes(), tmp_path / "docs" / "claims" / "rows"
    # README's headline: rewritten between the markers, a row a claim linking the report
    new = readme.read_text()
    lines = new.split("<!-- claims:start -->\n")[1].split("<!-- claims:end -->")[0].splitlines()
    assert new.startswith("intro\n") and new.endswith("<!-- claims:end -->\nrest\n")
    rows_ = [x for x in lines if x.startswith("| [")]
    # the claims with a verdict in the report's order, those not run yet on one line under it
    titles = [x.split(") ")[1].split(" | ")[0] for x in rows_]
    waiting = new.split("Declared, not run yet")[1].split("\n")[0] if "not run yet" in new else ""
    assert titles == [c.title for c in claims.CLAIMS if c.title in titles]
    for c in claims.CLAIMS:
        assert c.title in titles or f"[{c.id}](docs/claims.md#{c.id.lower()})" in waiting, c.id
    assert rows_[0].startswith("| [C1](docs/claims.md#c1) ") and "- old line" not in new
    assert rows_[0].replace("(docs/claims.md#", "(#") in got["text"]
    assert got["rows"] == rows and got["text"].encode() == text
    figs = {p.name: p.read_bytes() for p in (tmp_path / "docs" / "claims").glob("*.png")}
    assert {"claim-c1-forest.png", "async-accuracy_vs_workers.png", "async-plot.png",
            "async-val-vs-lr.png", "async-acc-vs-staleness.png"} <= set(figs)  # fmt: skip
    # the committed copy: the small files only, the same rows, one per line
    assert sorted(p.name for p in (rows / "async").iterdir()) == [
        "config.json", "summary.json", "table.md"
    ]  # fmt: skip
    copied = (rows / "async" / "summary.json").read_text()
    assert json.loads(copied) == json.loads((res / "async" / "summary.json").read_text())
    assert copied.count("\n") == len(json.loads(copied)["rows"]) + 5
    # the run folders gone: --from-rows, and the default without results/claims, rebuild it
    shutil.rmtree(tmp_path / "results")
    for argv in (["--from-rows"], []):
        claims.main([*argv, "--out", str(out)])
        assert out.read_bytes() == text
        assert {p.name: p.read_bytes() for p in out.parent.joinpath("claims").glob("*.png")} == figs
    # a README without the markers: one usage line before anything is written
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit) as e:
        claims.main(["--from-rows", "--out", str(tmp_path / "x.md"), "--readme", str(readme)])
    assert e.value.code == 2 and not (tmp_path / "x.md").exists()
    # the report carries no date: a rebuild another day reads the same
    assert b"Generated by `python -m study` from the rows committed in" in text
    assert b"(claims/async-accuracy_vs_workers.png)" in text


def test_provenance_records_commit_fingerprints_versions_and_reuse(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "git_state", lambda where=None: ("a" * 40, True))
    res = _results(tmp_path)
    out = tmp_path / "docs" / "claims.md"
    text = claims.main(["--results", str(res), "--out", str(out)])["text"]
    prov = text[text.index("## Provenance") :]
    assert f"**Commit of the report**: `{'a' * 40}` (with uncommitted changes) — the commit" in prov
    assert "[`claims/rows/`](claims/rows/index.json)" in prov and f"`{res}`" in prov
    assert (
        "| `async` | 170 | – | – | `feedfacecafebeef` | `0123456789ab` | `dddddddddddd` |" in prov
    )
    assert "| `async-raw` | 10 | – | – | `0000000000000000` | `ffffffffffff` |" in prov
    assert "0.0 hours of wall time; no row records its CPU time." in prov
    assert "jax 0.4.35, jaxlib 0.4.35, flax 0.10.2, optax 0.2.4" in prov
    assert "- `async-raw`: 4 cells reused from other code (--force-resume)." in prov
    assert '<a id="provenance"></a>' in text and "[Provenance](#provenance)" in text
    index = json.loads((tmp_path / "docs" / "claims" / "rows" / "index.json").read_text())
    sources = {"async": str(res), "async-raw": str(res)}
    assert index == {
        "source": str(res), "commit": "a" * 40, "dirty": True, "quick": False, "sources": sources
    }  # fmt: skip


def test_provenance_lists_versions_per_configuration_when_they_differ(tmp_path):
    a = _folder(tmp_path, "async", [], [4])
    b = _folder(tmp_path, "cliff", [], [], code=_code(versions={**VERSIONS, "jax": "0.5.0"}))
    lines = provenance.section({"async": a, "cliff": b}, None, None)
    table = "\n".join(lines)
    assert "| versions |" in table and "jax 0.5.0" in table and "jax 0.4.35" in table
    assert "Read directly from the run folders" in table


def test_provenance_sums_each_configurations_time_from_its_rows(tmp_path):
    """Each row carries its group's time over the group's runs: the table sums them per
    configuration (CPU time only where rows record it, saying how many do), and a line sums
    every configuration."""

    def folder(root, name, times):
        rows = [{"seed": i, **t} for i, t in enumerate(times)]
        return _folder(root, name, rows, [4])

    two = [{"wall_s": 1800.0, "cpu_s": 3240.0}] * 2  # 1 hour of wall, 1.8 CPU-hours
    old = [{"wall_s": 3600.0}, {"wall_s": 3600.0, "cpu_s": 360.0}, {}]  # partly recorded
    folders = {"a": folder(tmp_path, "a", two), "b": folder(tmp_path, "b", old)}
    families = {"A": ("a",), "A and B": ("a", "b", "c"), "C": ("c",)}  # "c": no folder
    text = "\n".join(provenance.section(folders, None, None, families))
    assert "| configuration | rows | wall h | CPU h | code hash |" in text
    assert "| `a` | 2 | 1.0 | 1.8 | `feedfacecafebeef` |" in text
    assert "| `b` | 3 | 2.0 (2 of 3 rows) | 0.1 (1 of 3 rows) |" in text
    assert (
        "3.0 hours of wall time; 1.9 CPU-hours (user + system, every thread) over the 3 of 5"
        in text
    )
    assert "- A (`a`): 1.0 hours of wall time; 1.8 CPU-hours" in text
    assert "- A and B (`a`, `b`): 3.0 hours of wall time; 1.9 CPU-hours" in text
    assert "- C" not in text
    assert "- A" not in "\n".join(provenance.section(folders, None, None))  # no families


def test_provenance_names_the_machines_that_computed_each_configurations_rows(tmp_path):
    """Each cell's machine (``host``) is copied into its row; the table names one machine,
    several with their counts, and the rows that record none."""
    a, b = "a" * 12, "b" * 12
    cells = [{"key": {"seed": s}, "host": h, "metrics": [{"step": 1}]}
             for s, h in ((0, a), (1, b), (2, a))]  # fmt: skip
    cells.append({"key": {"seed": 3}, "metrics": [{"step": 1}]})  # before hosts were recorded
    summary = {"rows": [{"seed": s, "test_acc": 0.5} for s in range(4)]}
    rows = provenance.with_cells(cells, summary)["rows"]
    assert [r.get("host") for r in rows] == [a, b, a, None]
    one = _folder(tmp_path, "one", rows[:1], [4])
    mixed = _folder(tmp_path, "mixed", rows, [4])
    old = _folder(tmp_path, "old", rows[3:], [4])
    text = "\n".join(provenance.section({"one": one, "mixed": mixed, "old": old}, None, None))
    assert "| dataset digest | machines |" in text
    assert "| `dddddddddddd` | `aaaaaaaaaaaa` |" in text
    assert "| `aaaaaaaaaaaa` ×2, `bbbbbbbbbbbb` ×1, 1 of 4 rows unrecorded |" in text
    assert text.count("| `dddddddddddd` | – |") == 1  # "old"


def test_snapshot_mirrors_the_results_and_drops_configurations_no_longer_there(tmp_path):
    res = _results(tmp_path)
    rows = tmp_path / "rows"
    provenance.snapshot(res, rows, list(claims.RUNS), quick=False)
    assert (rows / "async-raw" / "summary.json").exists()
    shutil.rmtree(res / "async-raw")
    snap = provenance.snapshot(res, rows, list(claims.RUNS), quick=True)
    assert not (rows / "async-raw").exists() and (rows / "async" / "config.json").exists()
    assert provenance.read_index(rows) == snap and snap.quick
    assert provenance.read_index(tmp_path / "none") is None


def test_keep_rows_adds_a_configuration_finished_elsewhere_to_the_committed_rows(tmp_path):
    """A configuration finished in a later session, on a machine that no longer has the other
    configurations' run folders, joins the report: the others keep their committed rows and
    figure copies, the index says where each configuration's rows came from, and the report
    rebuilds from the rows byte for byte."""
    res = _results(tmp_path)
    out, rows = tmp_path / "docs" / "claims.md", tmp_path / "docs" / "claims" / "rows"
    claims.main(["--results", str(res), "--out", str(out)])
    figs = out.parent / "claims"
    before = {p.name: p.read_bytes() for p in figs.glob("async-*.png")}
    assert "async-plot.png" in before
    raw = (rows / "async-raw" / "summary.json").read_bytes()
    later = tmp_path / "later" / "claims"  # only the configuration finished there
    shutil.copytree(res / "async", later / "async")
    shutil.rmtree(res)
    got = claims.main(["--results", str(later), "--out", str(out), "--keep-rows"])
    assert (rows / "async-raw" / "summary.json").read_bytes() == raw  # kept as it was
    assert {p.name: p.read_bytes() for p in figs.glob("async-*.png")} == before
    sources = json.loads((rows / "index.json").read_text())["sources"]
    assert sources == {"async": str(later), "async-raw": str(res)}
    text = got["text"]
    where = f"run folders in `{later}` for `async` and `{res}` for `async-raw`"  # 1 and 1
    assert where in text
    assert "(claims/async-plot.png)" in text and "`async-raw`" in text
    assert claims.main(["--from-rows", "--out", str(out)])["text"] == text
    # without --keep-rows the rows mirror the results folder: async-raw is dropped
    claims.main(["--results", str(later), "--out", str(out)])
    assert not (rows / "async-raw").exists()


def test_source_text_names_each_place_with_its_configurations(tmp_path):
    def text(*sources):
        return provenance.Snapshot(tmp_path, "r", None, False, False, sources).source_text()

    assert text() == "`r`" and text(("a", "x"), ("b", "x")) == "`x`"
    assert (
        text(("a", "x"), ("b", "y"), ("c", "y"))
        == "`x` for `a` and `y` for the other configurations"
    )
    assert text(("a", "x"), ("b", "y")) == "`x` for `a` and `y` for `b`"
    three = text(("a", "x"), ("b", "y"), ("c", "z"), ("d", "z"), ("e", "y"))
    assert three == "`x` for `a`, `y` for `b`, `e` and `z` for `c`, `d`"


def test_keep_rows_refuses_to_mix_smoke_and_full_rows(tmp_path, capsys):
    res = _results(tmp_path)
    out = tmp_path / "docs" / "claims.md"
    claims.main(["--quick", "--results", str(res), "--out", str(out)])
    index = (tmp_path / "docs" / "claims" / "rows" / "index.json").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        claims.main(["--results", str(res), "--out", str(out), "--keep-rows"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --keep-rows" in err[0] and "smoke" in err[0]
    assert (tmp_path / "docs" / "claims" / "rows" / "index.json").read_bytes() == index
    # the library call refuses with the same words (one check behind both)
    rows = tmp_path / "docs" / "claims" / "rows"
    with pytest.raises(ValueError) as info:
        provenance.snapshot(res, rows, ["pipeline"], quick=False, keep=True)
    assert err[0].endswith(str(info.value)) and rows.joinpath("index.json").read_bytes() == index
    assert provenance.kept_kind_problem(rows, True) is None


def test_a_rebuilt_smoke_report_stays_a_smoke_report(tmp_path):
    res = _results(tmp_path)
    out = tmp_path / "claims.md"
    text = claims.main(["--quick", "--results", str(res), "--out", str(out)])["text"]
    assert "**Smoke report (--quick)" in text
    assert claims.main(["--from-rows", "--out", str(out)])["text"] == text
    # the text alone: the same text, every figure beside the report left as it was
    figs = sorted((tmp_path / "claims").glob("*.png"))
    assert any(p.name.endswith("-forest.png") for p in figs)
    for p in figs:
        p.write_bytes(b"not rewritten")
    assert claims.main(["--from-rows", "--text-only", "--out", str(out)])["text"] == text
    assert sorted((tmp_path / "claims").glob("*.png")) == figs
    assert all(p.read_bytes() == b"not rewritten" for p in figs)


@pytest.mark.parametrize(
    "argv",
    [
        ["--from-rows", "--run"],
        ["--from-rows", "--results", "x"],
        ["--from-rows"],
        ["--text-only", "--quick"],
    ],
    ids=["with-run", "with-results", "no-rows", "text-only-without-rows"],
)
def test_from_rows_usage_errors_write_nothing(argv, tmp_path, capsys):
    out = tmp_path / "claims.md"
    out.write_text("the committed report\n")
    with pytest.raises(SystemExit) as e:
        claims.main([*argv, "--out", str(out)])
    assert e.value.code == 2 and ": error: " in capsys.readouterr().err
    assert out.read_text() == "the committed report\n"


def _d(a, values, unit="points", what=""):
    return Diff(a, "asgd", tuple(values), tuple(values), b_error=0.1, unit=unit, what=what)


def test_forest_plot_shows_every_difference_with_the_primary_first_and_the_expected_effect():
    up = _d("dc-asgd-a (M=8)", [0.02, 0.021, 0.019, 0.02, 0.022])
    down = _d("dc-asgd-a (raw)", [-0.02, -0.021, -0.019, -0.02, -0.022])
    slope = _d("gap-aware", [0.01, 0.011, 0.012], unit="points per doubling of M", what="slope")
    sec = {"DC-ASGD-a − SSGD": [down], "DC-ASGD-c − ASGD": [slope], "empty": [],
           "raw inputs": [dataclasses.replace(down, a="raw")]}  # fmt: skip
    ev = claims.Evidence(up, sec)
    c1 = claims.claim("C1")
    labels = [lab for lab, _ in figures.forest_items(ev)]
    assert labels == ["primary", "DC-ASGD-a − SSGD", "DC-ASGD-c − ASGD", "raw inputs"]
    # the figure shows what the verdict reads: the declared list (raw inputs is exploratory)
    labels = [lab for lab, _ in figures.forest_items(ev, c1.secondaries)]
    assert labels == ["primary", "DC-ASGD-a − SSGD", "DC-ASGD-c − ASGD"]
    fig = figures.forest_figure(c1, ev, smoke=True)
    assert len(fig.axes) == 2  # one panel per unit: points, points per doubling
    ax = fig.axes[0]
    ticks = ax.get_yticklabels()
    assert ticks[0].get_text().startswith("PRIMARY: dc-asgd-a (M=8) − asgd")
    assert ax.get_yticks()[0] == max(ax.get_yticks())  # the primary is the top row
    assert ticks[0].get_fontweight() == "bold" and ticks[1].get_fontweight() != "bold"
    vlines = sorted(
        round(float(ln.get_xdata()[0]), 6)
        for ln in ax.lines
        if ln.get_linestyle() in ("-", "--")
        and len(set(ln.get_xdata())) == 1
        and len(ln.get_xdata()) == 2
    )
    assert 0.0 in vlines and round(100 * c1.expected_points(up), 6) in vlines  # fmt: skip
    assert "C1" in fig.texts[0].get_text() or "C1" in fig._suptitle.get_text()
    assert any(t.get_gid() == "smoke" for t in fig.texts)
    (legend,) = fig.legends  # one legend, below the panels
    assert any("expected effect" in t.get_text() for t in legend.texts)
    assert figures.forest_figure(c1, claims.Evidence(None)) is None


def test_a_wide_secondary_is_cut_at_the_axis_instead_of_flattening_the_primary():
    up = _d("dc-asgd-a (M=8)", [0.02, 0.021, 0.019, 0.02, 0.022])
    wide = _d("dc-asgd-a (M=32)", [0.9, -0.8, 0.05])  # 3 seeds: an interval of ±2 (points ×100)
    ev = claims.Evidence(up, {"DC-ASGD-a − SSGD": [wide]})
    fig = figures.forest_figure(claims.claim("C1"), ev, smoke=True)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    mean = 100 * wide.mean
    assert lo <= 0 < 1.9 < 2.1 < hi and lo < mean < hi  # zero, the primary's interval, the mean
    assert hi < 100 * (wide.mean + wide.half) and lo > 100 * (wide.mean - wide.half)
    cut = [ln for ln in ax.lines if ln.get_marker() in ("<", ">")]
    assert {ln.get_marker() for ln in cut} == {"<", ">"}  # both ends of the wide row only
    assert {float(ln.get_xdata()[0]) for ln in cut} == {lo, hi}
    (legend,) = fig.legends
    assert any("beyond the axis" in t.get_text() for t in legend.texts)
    assert figures.x_range([("primary", up)], None)[0] < 0  # zero always shown
    # issue 53: an outlying mean (C1's 3-seed one-rate rows ran to +70) is cut, not the axis
    far = _d("one rate", [0.6, 0.8, 0.7])
    lo, hi = figures.x_range([("primary", up), ("one rate", far)], None)
    assert hi < 10 < 70 and lo < 0
    fig = figures.forest_figure(
        claims.claim("C1"), claims.Evidence(up, {"DC-ASGD-a − SSGD": [far]})
    )
    assert "+70.0" in [t.get_text() for t in fig.axes[0].texts]


def test_forest_plot_of_a_primary_without_pairs_is_still_drawn(tmp_path):
    empty = Diff("a", "b", (), (), b_error=float("nan"))
    fig = figures.forest_figure(claims.claim("C3"), claims.Evidence(empty))
    assert any("no seed where both trained" in t.get_text() for t in fig.axes[0].texts)
    path = figures.save_png(fig, tmp_path / "f.png")
    again = figures.save_png(figures.forest_figure(claims.claim("C3"), claims.Evidence(empty)),
                             tmp_path / "g.png")  # fmt: skip
    assert path.read_bytes() == again.read_bytes()  # no date in the PNG


def test_the_report_links_each_forest_plot_under_its_claim(tmp_path):
    res = _results(tmp_path)
    out = tmp_path / "claims.md"
    text = claims.main(["--results", str(res), "--out", str(out)])["text"]
    c1 = text[text.index("## C1.") : text.index("## C2.")]
    assert "](claims/claim-c1-forest.png)" in c1 and "(claims/async-accuracy_vs_workers.png)" in c1
    assert "claim-a1-forest" not in text  # a threshold check has no paired differences
    assert np.isfinite(claims.claim("C1").expected or np.nan)


def test_the_main_configurations_get_rate_and_staleness_figures_from_their_rows(tmp_path):
    res = _results(tmp_path)
    out = tmp_path / "claims.md"
    text = claims.main(["--results", str(res), "--out", str(out)])["text"]
    part = text[text.index("## Learning rates, staleness") : text.index("## Provenance")]
    for stem in ("val-vs-lr", "acc-vs-staleness", "plot"):
        assert f"(claims/async-{stem}.png)" in part
    assert "### `pipeline`" not in part  # not run: nothing drawn, nothing linked
    ctx = claims.Context(res, quick=False)
    rows, var = sweeps.sweep_rows(ctx, "async")
    assert var == "workers" and len(rows) == 170
    fig = sweeps.rate_figure("async", rows, var)
    assert len(fig.axes) == 5 and "validation accuracy vs learning rate" in fig._suptitle.get_text()
    stars = [ln for ln in fig.axes[1].lines if ln.get_marker() == "*"]
    assert {float(ln.get_xdata()[0]) for ln in stars} == {0.01}  # selected on validation
    fig = sweeps.staleness_figure("async", rows, var)
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "at one learning rate for every method (0.01, selected on validation for sgd)" in title


@pytest.mark.slow  # 3 s; the main configurations' figures test stays in make test
def test_pipeline_sweeps_use_stages_and_one_model(tmp_path):
    res = _results(tmp_path)
    rows = [
        {"method": m, "model": model, "stages": n, "lr": lr, "seed": s, "diverged": False,
         "final_val_accuracy": a - (lr == 0.1) * 0.05, "final_test_accuracy": a}
        for model in ("mlp", "cnn") for n in (2, 4) for lr in (0.01, 0.1)
        for m, a in (("sync", 0.95), ("vanilla", 0.9 - 0.01 * n)) for s in range(3)
    ]  # fmt: skip
    _folder(res, "pipeline", rows, [])
    out = tmp_path / "claims.md"
    text = claims.main(["--results", str(res), "--out", str(out)])["text"]
    assert "### `pipeline`" in text and "(claims/pipeline-val-vs-lr.png)" in text
    got, var = sweeps.sweep_rows(claims.Context(res, quick=False), "pipeline")
    assert var == "stages" and {r["model"] for r in got} == {"mlp"} and len(got) == 24
    fig = sweeps.staleness_figure("pipeline", got, var)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["2", "4"]
    assert "selected on validation for sync" in fig._suptitle.get_text().replace("\n", " ")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_claims_report_reads_head_and_dirt_through_the_same_helper(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("X = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    assert provenance.git_state(repo) == (None, False)  # not a repository yet
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = fingerprint.git_head(repo)
    assert head is not None and provenance.git_state(repo) == (head, False)
    (repo / "a.py").write_text("X = 2\n")
    (repo / "new.py").write_text("")  # untracked files do not make the checkout dirty
    assert provenance.git_state(repo) == (head, True)


def test_a_configuration_whose_rows_another_configuration_produced_is_flagged(tmp_path):
    """The configuration list prints the command the code declares now; rows computed under
    another (e.g. a smaller budget) are marked, with the fields that differ."""
    res = _results(tmp_path)
    now = json.loads(json.dumps(claims.RUNS["async"].config.resolved()))
    head = json.loads((res / "async" / "config.json").read_text())
    (res / "async" / "config.json").write_text(json.dumps({**head, "config": now}))
    text = claims.main(["--results", str(res), "--out", str(tmp_path / "c.md")])["text"]
    line = next(x for x in text.splitlines() if x.startswith("- `async`: `python -m"))
    assert "earlier configuration" not in line
    fresh = claims.assess_all(claims.Context(res, quick=False))
    old = {**now, "updates": now["updates"] // 3}
    (res / "async" / "config.json").write_text(json.dumps({**head, "config": old}))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- claims:start -->\n<!-- claims:end -->\n")
    text = claims.main(
        ["--results", str(res), "--out", str(tmp_path / "c.md"), "--readme", str(readme)]
    )["text"]
    # every verdict resting on the async rows carries it (headline, README), no other one does
    stale = claims.assess_all(claims.Context(res, quick=False))
    tag = "on rows of an earlier configuration of "

    def olds(v):  # the runs a verdict's caveat names as drifted
        return set(v.caveat.partition(tag)[2].split(", ")) - {""}

    for c in claims.CLAIMS:
        v, was = stale[c.id], fresh[c.id]
        assert v.verdict == was.verdict and v.caveat.split(tag)[0] == was.caveat.split(tag)[0]
        assert "async" not in olds(was)  # (the fixture's other runs may be drifted)
        if "async" in c.runs and v.verdict != "not run":
            assert olds(v) == olds(was) | {"async"}, c.id
            (row,) = [x for x in readme.read_text().splitlines() if f"[{c.id}](c.md#" in x]
            assert "rows of an earlier configuration" in row, row  # the headline says so
            assert f"**Verdict: {v.summary}.**" in text
        else:
            assert v.caveat == was.caveat, c.id
    assert "C1" in {c for c in stale if "async" in olds(stale[c])}
    line = next(x for x in text.splitlines() if x.startswith("- `async`: `python -m"))
    assert line.endswith(
        f". **Its rows are from an earlier configuration** (updates {now['updates'] // 3} → "
        f"{now['updates']}): every number below from this run is that configuration's until "
        "it is re-run"
    )
    assert provenance.drift({"a": [1, 2], "b": None}, {"a": [1], "c": {"x": 1}}) == [
        "a 1 → 1,2", 'c {"x": 1} → unset'
    ]  # fmt: skip


def test_the_recorded_commit_state_is_read_before_the_rows_are_written(tmp_path, monkeypatch):
    """The report's own copy of the rows must not make the tree it records look dirty."""
    res, rows = _results(tmp_path), tmp_path / "rows"
    seen = []
    monkeypatch.setattr(
        provenance,
        "git_state",
        lambda where=None: (seen.append(rows.exists()), ("a" * 40, False))[1],
    )
    snap = provenance.snapshot(res, rows, list(claims.RUNS), quick=False)
    assert seen == [False] and not snap.dirty and (rows / "async" / "summary.json").exists()


def test_every_configuration_is_in_one_family_of_the_provenance_sums():
    named = [n for names in FAMILIES.values() for n in names]
    assert sorted(named) == sorted(claims.RUNS) and len(set(named)) == len(named)


def test_every_verdict_on_such_a_configuration_says_so_before_any_other_note(tmp_path):
    """The caveat names the configuration, in the Summary and the README, and comes before
    the earlier-configuration note (which lists runs to its end)."""
    res = _results(tmp_path)
    before = claims.assess_all(claims.Context(res, quick=False))
    (res / "async" / budget.FILE).write_text(
        json.dumps([_budget_fact("sgd", None, [0.02, 0.01, 10])])
    )
    after = claims.assess_all(claims.Context(res, quick=False))
    note = "reference not converged at the budget of async"
    flagged = set()
    for c in claims.CLAIMS:
        v, was = after[c.id], before[c.id]
        assert v.verdict == was.verdict
        if "async" in c.runs and v.verdict != "not run":
            tag = "on rows of an earlier configuration"
            head, _, rest = was.caveat.partition(tag)
            want = [head.rstrip("; "), note, tag + rest if rest else ""]
            assert v.caveat == "; ".join(x for x in want if x), c.id
            assert note in v.summary
            flagged.add(c.id)
        else:
            assert v.caveat == was.caveat, c.id
    assert "C1" in flagged


def test_the_committed_report_and_readme_rebuild_from_the_committed_rows(tmp_path):
    """study/claims.md and README's generated blocks are what the code makes of the rows under
    study/claims/rows, byte for byte (``--text-only``: the figures, whose bytes depend on the
    plotting library's build, are linked where they would be drawn and not redrawn; the smoke
    report's test checks the text is the same with them): a change to how the report reads or
    renders rows fails here until `python -m study --from-rows --readme README.md` is re-run."""
    root = pathlib.Path(__file__).resolve().parents[2]
    docs = tmp_path / "study"
    shutil.copytree(
        root / "study" / "claims", docs / "claims", ignore=shutil.ignore_patterns("cells")
    )
    shutil.copy(root / "README.md", tmp_path / "README.md")
    out = docs / "claims.md"
    argv = [
        "--from-rows",
        "--text-only",
        "--out",
        str(out),
        "--readme",
        str(tmp_path / "README.md"),
    ]
    claims.main(argv)
    assert out.read_text() == (root / "study" / "claims.md").read_text()
    assert (tmp_path / "README.md").read_text() == (root / "README.md").read_text()
