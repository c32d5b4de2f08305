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
