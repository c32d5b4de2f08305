"""The report's headline (``study/headline.py``): the table, the practitioner's questions and
the README that quotes them."""

import json
import re
from pathlib import Path

import study as claims
from study import headline
from study.core import Verdict
from study.verdicts import Diff

ROOT = Path(__file__).resolve().parents[2]


def _v(values, a="x (N=8)", b="y (N=8)", unit="points", scale=100.0, what="", **kw):
    d = Diff(a, b, tuple(values), tuple(values), unit=unit, scale=scale, what=what)
    return Verdict("held", "", primary=d, **kw)


def test_the_answer_reads_the_primary_in_the_metrics_direction():
    up = [0.02, 0.021, 0.019, 0.02, 0.022]
    assert headline.answer(_v(up)) == "x (N=8) better than y (N=8)"
    # a loss difference a − b > 0 in the claimed direction means b is lower: b is better
    loss = _v([x * 10 for x in up], "stale (τ=4)", "predicted (τ=4)", "nats", 1.0)
    assert headline.answer(loss) == "predicted (τ=4) better than stale (τ=4)"
    flat = _v([0.001, -0.001, 0.0005, -0.0005, 0.0])
    assert headline.answer(flat).startswith("x (N=8) ≈ y (N=8) (within ±")
    # non-inferiority, either way round: the method and its reference by name
    ni = "sync (N=8) + 0.05 − 2bw (N=8) (non-inferiority, margin 0.05 nats)"
    worse = _v([-0.3, -0.31, -0.29, -0.3, -0.32], "sync (N=8)", "2bw (N=8)", "nats", 1.0, ni)
    assert headline.answer(worse) == "2bw (N=8) worse than sync (N=8) by more than the margin"
    ni = "diloco-eager (M=4) − diloco + 1 point (non-inferiority, margin 1 point)"
    ok = _v(up, "diloco-eager (M=4)", "diloco", what=ni)
    assert headline.answer(ok) == "diloco-eager (M=4) within the margin of diloco"
    untestable = Verdict("untestable here (MDE 2 vs expected 1 points)", "", primary=flat.primary)
    assert headline.answer(untestable).startswith("no call")
    assert headline.answer(Verdict("not reached, the upper bound above it by 0.3", "")) == (
        "target missed"
    )


def test_qualifiers_name_set_up_checks_and_caveats_but_not_the_regime():
    v = Verdict(
        "did not hold",
        "",
        setup="set-up check, α = 0 (a0): 9 of 9 for the claim; set-up check: 0 of 2 beyond noise",
        caveat="a bound: x at its grid's smallest rate; reference not converged at the budget of "
        "d; regime: gpt-cpu (415 k parameters)",
    )
    assert headline.qualifiers(v) == (
        "set-up check for; set-up check within noise; a bound; reference not converged"
    )
    assert headline.qualifiers(Verdict("held", "")) == "–"


def _rows(arms, stages=8):
    out = []
    for m, (val, test) in arms.items():
        for s in range(5):
            loss = {"final_val_loss": val + 0.001 * s, "final_test_loss": test + 0.01 * s}
            out.append({"method": m, "model": "gpt-cpu", "stages": stages, "lr": 0.003,
                        "seed": s, "diverged": False, "dataset": "shakespeare",
                        **loss})  # fmt: skip
    return out


def _folder(root, name, rows, **config):
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    (d / "config.json").write_text(json.dumps({"config": {"dataset": "shakespeare", **config}}))


def test_a_question_names_the_validation_best_and_pairs_the_others_with_it(tmp_path):
    _folder(tmp_path, "lm-depth", _rows({"sync": (1.6, 1.6), "vanilla": (2.2, 2.2)}))
    arms = {"stash": (2.0, 2.21), "2bw": (1.9, 1.9), "pipemare": (2.1, 1.91)}
    _folder(tmp_path, "lm-policies", _rows(arms))
    lines = headline.questions(claims.Context(tmp_path, quick=False))
    q = lines[0]
    assert q.startswith("- **Which policy for an 8-stage") and "(`lm-depth`, `lm-policies`)" in q
    got = lines[1]
    assert got.startswith("  - stages 8: **2bw** (best on validation; test 1.920 ± 0.020 nats)")
    # pipemare is worse on validation but ties 2bw on test (paired: +0.010 every seed)
    assert "within noise of it: none" in got and "pipemare +0.010 ± 0.000 nats" in got
    assert "vanilla +0.300 ± 0.000 nats, stash +0.310 ± 0.000 nats" in got
    assert got.endswith("its cost against sync (no staleness): +0.300 ± 0.000 nats")
    # a run of another set-up is not read with them
    (tmp_path / "lm-policies" / "config.json").write_text(
        json.dumps({"config": {"dataset": "shakespeare", "steps": 4000}})
    )
    lines = headline.questions(claims.Context(tmp_path, quick=False))
    assert "(`lm-depth`)" in lines[0] and "**vanilla**" in lines[1]
    assert headline.questions(claims.Context(tmp_path / "none", quick=False))[0].endswith(
        "(not run)"
    )
    # the ladder's 4k rung, once finished, answers alone, with the arms only it ran
    ladder = {"sync": (1.5, 1.5), "vanilla": (2.0, 2.0), "2bw-ef": (1.55, 1.56)}
    _folder(tmp_path, "lm-ladder-4k", _rows(ladder))
    lines = headline.questions(claims.Context(tmp_path, quick=False))
    assert "(`lm-ladder-4k`)" in lines[0] and lines[1].startswith("  - stages 8: **2bw-ef**")


def test_every_interval_the_readme_quotes_is_the_reports():
    """The README says no more than the report (issue 53): each ``x ± y`` in it appears in
    study/claims.md or a page the README links."""
    readme = (ROOT / "README.md").read_text()
    pages = [ROOT / "study" / "claims.md"]
    for link in re.findall(r"\]\(([^)#]+\.md)", readme):
        if (ROOT / link).exists():
            pages.append(ROOT / link)
    text = "\n".join(p.read_text() for p in pages)
    quoted = re.findall(r"[+-−]?\d[\d.,]*\s?±\s?\d[\d.,]*", readme)
    assert quoted, "the README quotes the headline's intervals"
    missing = [q for q in quoted if q not in text]
    assert not missing, missing


def test_the_report_and_the_readme_lead_with_the_same_headline():
    report = (ROOT / "study" / "claims.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert report.split("## Headline", 1)[0].count("\n") < 6  # the headline leads the report
    head = [x for x in report.splitlines() if x.startswith("| [")]
    assert len(head) == len(claims.CLAIMS)
    for row in head:  # the README's row is the report's, its links into the report
        cid = re.match(r"\| \[([^\]]+)\]", row).group(1)
        if "**not run**" in row:  # declared, not run yet: one line under the README's table
            assert f"[{cid}](study/claims.md#{cid.lower()})" in readme.split("Declared, not run")[1]
            continue
        assert re.sub(r"\(#", "(study/claims.md#", row) in readme
    for q in headline.QUESTIONS:
        assert f"- **{q.text}**" in report and f"- **{q.text}**" in readme


def test_a_reward_tasks_regime_names_its_model_task_and_updates(tmp_path):
    d = tmp_path / "rl"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"rows": [{"arm": "reinforce", "tau": 0}]}))
    cfg = {"model": "gpt-tiny", "length": 8, "symbols": 16, "steps": 300}
    (d / "config.json").write_text(json.dumps({"config": cfg}))
    c = claims.Claim("X", "t", "s", "p", ("rl",), lambda ctx: None)
    got = headline.regime_of(claims.Context(tmp_path, quick=False), c)
    assert got == "gpt-tiny, reverse 8 of 16, 300 updates"  # not "mlp, None" (no dataset)


def test_the_headline_answers_the_practitioners_delayed_nesterov_question():
    """Issue 53's done-when: "does Delayed Nesterov fix naive asynchronous Nesterov" from the
    headline alone — both arms, paired, in the README's generated block."""
    text = (ROOT / "README.md").read_text()
    i = text.index("**Does Delayed Nesterov with dynamic local updates fix naive asynchronous")
    answer = text[i:].split("\n")[1]
    assert "async-delayed" in answer and "async-nesterov" in answer and " ± " in answer
