"""study.configs: every configuration is a typed config whose command line round-trips."""

import dataclasses

import study
from experiments.config import Base


def test_claims_hold_config_objects_whose_command_lines_round_trip():
    from experiments.config import from_argv, to_argv

    for name, spec in study.RUNS.items():
        # an experiment's typed config: the common fields (Base), or a frozen dataclass of
        # its own with quick and out (stale_rl: no dataset)
        fields = {f.name for f in dataclasses.fields(spec.config)}
        assert isinstance(spec.config, Base) or {"quick", "out", "force_resume"} <= fields, name
        assert hasattr(spec.config, "resolved"), name
        assert from_argv(type(spec.config), to_argv(spec.config))[0] == spec.config, name
        smoke = spec.at(quick=True)
        assert smoke.quick and type(smoke) is type(spec.config), name
    assert study.RUNS["async-fixed-lr"].at(True).lrs == (0.02,)


def test_diloco_on_the_gpt_stage_one_shares_one_start_and_its_budget():
    """Every configuration of stage 1 starts each seed from the same warm start (the fields that
    make it are equal), 12.5 % of the workers' steps, and their smoke versions are small."""
    from study.configs_modern import DILOCO_GPT_RUNS, INNER_GRID

    cfgs = {name: spec.config.resolved() for name, spec in DILOCO_GPT_RUNS.items()}
    start = ("dataset", "models", "optimizer", "momentum", "batch_size", "warm_start", "warm_lr")
    assert len({tuple(str(c[k]) for k in start) for c in cfgs.values()}) == 1
    c = cfgs["diloco-gpt-dp"]
    assert c["warm_start"] / (c["steps"] * c["workers"][0]) == 0.125 and c["warm_lr"] == 0.003
    assert sorted(c["inner_lr"] for n, c in cfgs.items() if "inner" in n) == list(INNER_GRID)
    for spec in DILOCO_GPT_RUNS.values():
        q = spec.at(True).resolved()
        assert q["models"] == ["gpt-tiny"] and q["steps"] == 40 and q["warm_start"] == 10
