"""The claims report's budget check (``study/budget.py``): the synchronous
reference's convergence at its rate selected on validation, read from the cells' curves,
committed as ``budget.json`` beside the rows and rendered in the report's Budget section."""

import json

from study import budget, provenance
from tests.study.budget_facts import fact as _fact


def _cell(folder, key, val, curve):
    row = {**key, "final_val_accuracy": val, "final_test_accuracy": val, "diverged": False}
    metrics = [{"step": 100 * (i + 1), "val_accuracy": v} for i, v in enumerate(curve)]
    name = "-".join(str(v) for v in key.values())
    (folder / "cells" / f"{name}.json").write_text(
        json.dumps({"key": key, "row": row, "metrics": metrics})
    )
    return row


def _folder(root):
    """1-worker SGD at two rates (0.01 wins on validation: flat from update 300) and a rising
    pipeline-style ``sync`` arm; an ASGD cell that is no reference."""
    folder = root / "async"
    (folder / "cells").mkdir(parents=True)
    rows = []
    for seed in range(3):
        flat = [0.5, 0.7, 0.8 + 0.001 * seed, 0.80, 0.805, 0.80]
        rising = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8 + 0.01 * seed]
        sgd = {"method": "sgd", "workers": 1, "lr": 0.01, "seed": seed}
        rows.append(_cell(folder, sgd, 0.8, flat))
        rows.append(_cell(folder, {**sgd, "lr": 0.1}, 0.6, [0.6] * 6))
        rows.append(_cell(folder, {"method": "sync", "workers": 2, "lr": 0.1, "seed": seed},
                          0.8, rising))  # fmt: skip
        rows.append(_cell(folder, {**sgd, "method": "asgd", "workers": 4}, 0.1, [0.1] * 6))
    (folder / "summary.json").write_text(json.dumps({"rows": rows}))
    return folder


def test_facts_read_the_selected_rates_curves(tmp_path):
    got = {f["setting"]["method"]: f for f in budget.facts(_folder(tmp_path))}
    assert set(got) == {"sgd", "sync"}  # ASGD is no reference
    sgd, sync = got["sgd"], got["sync"]
    assert sgd["setting"] == {"method": "sgd", "workers": 1} and sgd["lr"] == 0.01
    assert sgd["flat_since"] == 300 and sgd["steps"] == 600 and sgd["seeds"] == 3
    assert sync["flat_since"] is None  # still rising


def test_the_snapshot_commits_them_and_the_report_says_which_converged(tmp_path):
    folder = _folder(tmp_path / "results")
    rows = tmp_path / "rows"
    provenance.snapshot(tmp_path / "results", rows, ["async"], quick=False)
    assert json.loads((rows / "async" / budget.FILE).read_text()) == json.loads(
        json.dumps(budget.facts(folder))
    )
    lines = budget.section(rows, ["async", "not-run"])
    assert lines[:5] == ["", '<a id="budget"></a>', "", "## Budget", ""]
    (sgd,) = [x for x in lines if "method sgd" in x]
    assert sgd.startswith("- `async`, method sgd, workers 1, lr 0.01: converged; validation")
    assert "flat (±1 point) since update 300 of 600" in sgd
    (sync,) = [x for x in lines if "method sync" in x]
    assert "**not converged**" in sync and "not within ±1 point of its plateau" in sync
    # a configuration without a reference arm: no file, no section
    for p in (folder / "cells").glob("*.json"):
        if '"method": "asgd"' not in p.read_text():
            p.unlink()
    provenance.snapshot(tmp_path / "results", rows, ["async"], quick=False)
    assert not (rows / "async" / budget.FILE).exists() and budget.section(rows, ["async"]) == []


def test_a_language_models_reference_is_read_in_nats_against_the_corpus(tmp_path):
    """A text run: the rate with the lowest validation loss, its loss curve, and the line
    compares the final loss with the corpus's unigram entropy and the uniform loss."""
    folder = tmp_path / "lm-depth"
    (folder / "cells").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"dataset": "shakespeare"}}))
    for seed in range(2):
        for lr, end in ((0.003, 1.9), (0.01, 2.2)):
            key = {"method": "sync", "stages": 8, "lr": lr, "seed": seed}
            row = {**key, "final_val_loss": end, "final_test_loss": end, "diverged": False}
            curve = [{"step": 100 * (i + 1), "val_loss": v} for i, v in
                     enumerate([3.5, 2.6, 2.2, end + 0.01, end, end])]  # fmt: skip
            (folder / "cells" / f"{lr}-{seed}.json").write_text(
                json.dumps({"key": key, "row": row, "metrics": curve})
            )
    (fact,) = budget.facts(folder)
    assert fact["lr"] == 0.003 and fact["metric"] == "loss"
    assert [round(fact[k], 2) for k in ("unigram", "bigram", "trigram")] == [3.37, 2.52, 2.06]
    assert abs(fact["uniform"] - 4.4188) < 1e-3
    (line,) = [x for x in budget.section(_rows_of(tmp_path, fact), ["lm-depth"]) if "lm-" in x]
    assert "validation loss 1.903 nats over the last third of 600 updates" in line
    # a validation curve against the validation split's levels (trigram 2.06; test 1.97)
    assert "below the trigram level (2.06) of the corpus (count models, validation split" in line


def test_level_text_places_a_loss_among_the_levels():
    lv = {"unigram": 3.29, "bigram": 2.57, "trigram": 1.97, "uniform": 4.42}
    assert budget.level_text(3.5, lv).startswith("**above the unigram level** (3.29)")
    assert budget.level_text(2.58, lv).startswith("at the bigram level (2.57)")
    assert budget.level_text(3.0, lv).startswith("between the unigram (3.29) and bigram (2.57)")
    assert budget.level_text(1.5, lv).startswith("below the trigram level (1.97)")


def _rows_of(root, fact):
    rows = root / "rows"
    (rows / "lm-depth").mkdir(parents=True)
    (rows / "lm-depth" / budget.FILE).write_text(json.dumps([fact]))
    return rows


def test_local_sgds_data_parallel_arm_is_a_reference_and_its_rate_a_multiple(tmp_path):
    """``local_sgd``'s ``dp`` (data parallelism on the same tokens) is a synchronous reference;
    its grid scales the inner rate, and the line says so rather than calling it a rate."""
    folder = tmp_path / "diloco"
    (folder / "cells").mkdir(parents=True)
    for seed in range(3):
        key = {"method": "dp", "workers": 4, "inner_steps": 10, "lr": 8.0, "seed": seed}
        _cell(folder, key, 0.8, [0.3, 0.5, 0.6, 0.7, 0.75, 0.8 + 0.01 * seed])
        _cell(folder, {**key, "method": "diloco", "lr": 0.7}, 0.8, [0.8] * 6)
    (f,) = budget.facts(folder)
    assert f["setting"] == {"method": "dp", "workers": 4, "inner_steps": 10} and f["lr"] == 8.0
    rows = tmp_path / "rows" / "diloco"
    rows.mkdir(parents=True)
    (rows / budget.FILE).write_text(json.dumps([f]))
    (line,) = [x for x in budget.section(tmp_path / "rows", ["diloco"]) if x.startswith("- ")]
    assert line.startswith(
        "- `diloco`, method dp, workers 4, inner_steps 10, rate 8 × the inner rate: "
        "**not converged**"
    )


def test_unconverged_lists_the_configurations_whose_reference_still_improves(tmp_path):
    """Not flat by the end, still rising beyond noise over the last third, or no curve without
    divergence: listed; a language model's reference (compared at equal updates): never."""
    rows = tmp_path / "rows"
    facts = {
        "flat": [_fact("sgd", 300, [0.001, 0.004, 10])],
        "late": [_fact("sgd", 300, [0.001, 0.004, 10]), _fact("sync", None, [0.0, 0.01, 10])],
        "rising": [_fact("sgd", 500, [0.02, 0.006, 10])],
        "noisy": [_fact("sgd", 500, [0.02, 0.03, 10])],  # rising within noise: converged
        "diverged": [_fact("dp", None, [float("nan"), float("nan"), 0], plateau=None)],
        "lm": [_fact("sync", None, [-0.1, 0.01, 5], metric="loss", plateau=1.9)],
    }
    for name, found in facts.items():
        (rows / name).mkdir(parents=True)
        (rows / name / budget.FILE).write_text(json.dumps(found))
    names = [*facts, "not-run"]
    assert budget.unconverged(rows, names) == ["late", "rising", "diverged"]
    assert budget.unconverged(rows, ["noisy", "flat", "lm"]) == []
    lines = budget.section(rows, names)  # the section says the same of the others
    said = {n for n in facts for x in lines if x.startswith(f"- `{n}`") and "**not conv" in x}
    assert said == {"late", "rising"}
    assert any(x.startswith("- `diverged`") and "no curve without divergence" in x for x in lines)


def test_a_reference_on_a_decaying_schedule_is_judged_by_a_longer_run_of_it(tmp_path):
    """AdamW's warm-up + cosine makes the last third rise at any length: such a reference is
    not converged when a longer run of the same reference (same setting, data, optimizer) ends
    more than a point higher, converged within a point, and not judged without one."""
    rows = tmp_path / "rows"
    cfg = {"dataset": "mnist1d", "optimizer": "adamw", "inner_lr": 0.003, "batch_size": 32}
    rising = [0.02, 0.006, 10]
    runs_ = {
        "short": (cfg, 2250, 0.873),
        "long": (cfg, 6750, 0.909),
        "longer": (cfg, 13500, 0.914),
        "other-lr": ({**cfg, "inner_lr": 0.01}, 2250, 0.80),  # another reference: no pair
    }
    for name, (c, steps, plateau) in runs_.items():
        (rows / name).mkdir(parents=True)
        (rows / name / "config.json").write_text(json.dumps({"config": {**c, "steps": steps}}))
        f = {**_fact("dp", None, rising, plateau=plateau), "steps": steps}
        (rows / name / budget.FILE).write_text(json.dumps([f]))
    names = list(runs_)
    assert budget.unconverged(rows, names) == ["short"]  # 4.1 points below `longer`
    assert budget.unconverged(rows, ["short", "long"]) == ["short"]
    assert budget.unconverged(rows, ["long", "longer"]) == []  # within a point
    assert budget.unconverged(rows, ["short", "other-lr"]) == []  # nothing longer to judge by
    lines = {x.split("`")[1]: x for x in budget.section(rows, names) if x.startswith("- `")}
    assert "**not converged**; validation plateau 87.3 % at 2,250 updates against 91.4 % at " \
        "13,500 (`longer`)" in lines["short"]  # fmt: skip
    assert lines["long"].split(": ")[1].startswith("converged; validation plateau 90.9 %")
    assert (
        ": not judged; validation plateau 91.4 % over the last third of 13,500" in (lines["longer"])
    )
    assert "(here +2.0 ± 0.6 points over 10 seeds)" in lines["longer"]
    # a constant-rate reference keeps the last-third test (rising: not converged, whatever
    # ran longer), and a longer run of it can only add a reason
    for name in ("short", "long"):
        (rows / name / "config.json").write_text(
            json.dumps({"config": {**cfg, "optimizer": "sgd"}})
        )
    assert budget.unconverged(rows, ["short", "long"]) == ["short", "long"]


def test_a_flat_constant_rate_reference_is_not_converged_when_a_longer_run_ends_higher(tmp_path):
    """1-worker SGD flat over its own last third at 9,000 updates, and the same reference
    (same setting, data, momentum, batch) 2.1 points higher at 27,000 (the committed
    ``async-m128`` against ``async``): not converged; within a point: converged. Another
    momentum is another reference."""
    rows = tmp_path / "rows"
    cfg = {"dataset": "mnist1d", "momentum": 0.9, "batch_size": 32}
    flat = [0.01, 0.01, 10]  # within noise
    runs_ = {
        "short": (cfg, 9000, 0.839),
        "long": (cfg, 27000, 0.860),
        "close": (cfg, 27000, 0.845),
        "mu0": ({**cfg, "momentum": 0.0}, 27000, 0.90),
    }
    for name, (c, steps, plateau) in runs_.items():
        (rows / name).mkdir(parents=True)
        (rows / name / "config.json").write_text(json.dumps({"config": {**c, "steps": steps}}))
        f = {**_fact("sgd", 300, flat, plateau=plateau), "steps": steps}
        (rows / name / budget.FILE).write_text(json.dumps([f]))
    assert budget.unconverged(rows, ["short"]) == []  # its own curve alone: flat
    assert budget.unconverged(rows, ["short", "long"]) == ["short"]
    assert budget.unconverged(rows, ["short", "close", "mu0"]) == []
    lines = budget.section(rows, ["short", "long"])
    short = next(x for x in lines if x.startswith("- `short`"))
    head = "- `short`, method sgd, lr 0.01: **not converged**; validation plateau 83.9 %, "
    assert short.startswith(head + "flat (±1 point) since update 300 of 9,000")
    tail = "; a longer run of the same reference (`long`) plateaus at 86.0 % at 27,000 updates."
    assert short.endswith(tail)
    assert "longer run of the same reference where one ran" in "".join(lines)


def test_a_language_models_rungs_judge_each_other(tmp_path):
    """The ladder's rungs of one LM reference (same setting, data, optimizer, batch): the 1k
    rung is not converged where the 4k rung ends more than 0.02 nats lower, and the 4k rung is
    converged only where the 1k rung is within 0.02 of it; alone, not judged."""
    rows = tmp_path / "rows"
    cfg = {"dataset": "shakespeare", "optimizer": "adamw", "batch_size": 16}
    setting = {"model": "gpt-cpu", "stages": 8, "method": "sync"}

    def rung(name, steps, plateau, c=cfg):
        (rows / name).mkdir(parents=True, exist_ok=True)
        (rows / name / "config.json").write_text(json.dumps({"config": {**c, "steps": steps}}))
        f = {**_fact("sync", None, [-0.09, 0.01, 5], "loss", plateau), "steps": steps,
             "setting": setting}  # fmt: skip
        (rows / name / budget.FILE).write_text(json.dumps([f]))

    rung("lm-depth", 1000, 2.012)
    rung("lm-ladder-4k", 4000, 1.630)
    rung("lm-asyncpp", 1000, 2.020, {**cfg, "optimizer": "nadamw"})  # another reference
    assert budget.unconverged(rows, ["lm-asyncpp"]) == []  # alone: not judged
    names = ["lm-depth", "lm-ladder-4k", "lm-asyncpp"]
    assert budget.unconverged(rows, names) == ["lm-depth", "lm-ladder-4k"]
    lines = {x.split("`")[1]: x for x in budget.section(rows, names) if x.startswith("- `")}
    assert "lr 0.01: **not converged** (against `lm-ladder-4k`, 4,000 updates: 1.630 nats, " \
        "-0.382); validation loss 2.012" in lines["lm-depth"]  # fmt: skip
    assert "(against `lm-depth`, 1,000 updates: 2.012 nats, +0.382)" in lines["lm-ladder-4k"]
    assert "converged" not in lines["lm-asyncpp"]
    rung("lm-ladder-4k", 4000, 1.995)  # four times the updates gained 0.017: converged at 4k
    assert budget.unconverged(rows, names) == []
