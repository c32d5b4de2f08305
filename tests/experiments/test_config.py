"""experiments/config.py: typed configs, validated when built (a ValueError naming the field,
never SystemExit), and the command line generated from them (sync_baseline is the first
experiment in this shape)."""

import dataclasses

import pytest

from experiments import sync_baseline
from experiments.config import Base, ConfigError, opt, parser, run_config
from experiments.runs.groups import TIMING_FIELDS
from jaxstale import models

Config = sync_baseline.Config


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"lrs": (0.01, 0.01)}, "lrs", "given twice"),
        ({"lrs": (0.01, float("nan"))}, "lrs", "got nan"),
        ({"lrs": (-0.1,)}, "lrs", "in (0, inf)"),
        ({"lrs": ()}, "lrs", "at least one value"),
        ({"momentum": -1.0}, "momentum", "in [0, 1)"),
        ({"momentum": float("inf")}, "momentum", "got inf"),
        ({"seeds": 0}, "seeds", "in [1, inf)"),
        ({"steps": 1.5}, "steps", "expected an int"),
        ({"steps": True}, "steps", "expected an int"),
        ({"model": ("mlp", "mlp")}, "model", "given twice"),
        ({"model": ("foo",)}, "model", "unknown model 'foo'"),
        ({"dataset": "imagenet"}, "dataset", "unknown dataset 'imagenet'"),
        ({"standardize": "zca"}, "standardize", "unknown standardisation 'zca'"),
        ({"quick": 1}, "quick", "True or False"),
        ({"out": "  "}, "out", "empty string"),
        ({"momentum": None}, "momentum", "required"),
    ],
)
def test_a_bad_value_raises_a_value_error_naming_the_field(kwargs, field, words):
    with pytest.raises(ConfigError) as e:
        Config(**kwargs)
    assert isinstance(e.value, ValueError) and e.value.field == field
    assert str(e.value).startswith(f"{field}: ") and words in str(e.value), str(e.value)


def test_values_are_normalised():
    cfg = Config(lrs=[0.01, 1], model="mlp", seeds=2)
    assert cfg.lrs == (0.01, 1.0) and isinstance(cfg.lrs[1], float) and cfg.model == ("mlp",)
    assert cfg == Config(lrs=(0.01, 1.0), model=("mlp",), seeds=2)  # hashable, comparable
    assert {cfg: 1}[Config(lrs=(0.01, 1.0), model=("mlp",), seeds=2)] == 1
    assert run_config(cfg)["lrs"] == [0.01, 1.0] and "out" not in run_config(cfg)


def test_names_registered_after_import_count():
    models.register_model("cfg-late", lambda **kw: None, overwrite=True)
    assert Config(model=("cfg-late",)).model == ("cfg-late",)
    # argparse wraps the list of names, at a hyphen too: compare without the white space
    assert "cfg-late" in "".join(parser(Config).format_help().split())


def test_checks_that_need_the_data_raise_too(tmp_path):
    """run(Config(...)) raises a ValueError; it never exits the interpreter."""
    with pytest.raises(ConfigError) as e:
        sync_baseline.run(Config(batch_size=100000, out=str(tmp_path / "run")))
    assert e.value.field == "batch_size" and not (tmp_path / "run").exists()
    with pytest.raises(ConfigError) as e:
        sync_baseline.run(Config(steps=10**12, out=str(tmp_path / "run")))
    assert e.value.field == "steps" and "of memory" in e.value.reason


def test_help_lists_every_flag_with_its_default_and_choices():
    text = " ".join(parser(Config, "demo").format_help().split())
    for f in dataclasses.fields(Config):
        assert "--" + f.name.replace("_", "-") in text, f.name
    assert "(default 0.9)" in text and "any of: mlp, cnn, resnet20" in text
    assert "any of: feature, channel, none" in text


def test_command_line_and_python_give_the_same_run(tmp_path):
    argv = ["--quick", "--steps", "6", "--eval-every", "3", "--seeds", "1", "--lrs", "0.05"]
    argv += ["--model", "mlp"]
    cli = sync_baseline.main([*argv, "--out", str(tmp_path / "cli")])
    cfg = Config(quick=True, steps=6, eval_every=3, seeds=1, lrs=(0.05,), model=("mlp",))
    py = sync_baseline.run(dataclasses.replace(cfg, out=str(tmp_path / "py")))
    assert [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in py] == [
        {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in cli["rows"]
    ]
    out = sync_baseline.report(py, dataclasses.replace(cfg, out=str(tmp_path / "py")))
    assert out["table"] == cli["table"]
    assert (tmp_path / "py" / "table.md").read_text() == (tmp_path / "cli" / "table.md").read_text()


def test_a_subclass_adds_and_overrides_fields():
    @dataclasses.dataclass(frozen=True)
    class Mine(Base):
        workers: tuple[int, ...] = opt((4, 8), "worker counts", low=1)
        seeds: int | None = opt(3, "seeds", low=1)

    assert Mine().workers == (4, 8) and Mine().seeds == 3
    with pytest.raises(ConfigError, match="workers: 4 is given twice"):
        Mine(workers=(4, 4))
    ns = parser(Mine).parse_args(["--workers", "1", "2,3"])
    assert Mine(**vars(ns)).workers == (1, 2, 3)


def test_a_negative_value_round_trips_as_flag_equals_value():
    from experiments import async_workers
    from experiments.config import from_argv, to_argv

    cfg = async_workers.Config(methods=("lc-asgd",), lc_lambdas=(-0.1, 0.1))
    argv = to_argv(cfg)
    assert "--lc-lambdas=-0.1,0.1" in argv and from_argv(async_workers.Config, argv)[0] == cfg


def test_memory_is_the_least_of_the_machine_and_the_process_limits(monkeypatch):
    """``ulimit -v`` (RLIMIT_AS) below the machine's RAM is the limit the checks read: a run
    under it passed the check and died mid-run, leaving a run folder (issue 51)."""
    import resource

    from experiments.config import check_memory, machine_memory

    ram = machine_memory()
    limits = {resource.RLIMIT_AS: (3 << 30, resource.RLIM_INFINITY)}
    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits.get(which, real(which)))
    assert machine_memory() == min(ram, 3 << 30)
    with pytest.raises(ConfigError, match="this process may use"):
        check_memory({"steps": 4 << 30})


def test_standardize_on_a_text_is_one_line_even_at_its_default(capsys):
    from experiments import constant_delay

    for value in ("feature", "none"):
        with pytest.raises(SystemExit) as e:
            constant_delay.main(["--dataset", "shakespeare", "--standardize", value])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "argument --standardize: a text's inputs are token ids" in err
    with pytest.raises(ConfigError, match="token ids"):
        constant_delay.Config(dataset="shakespeare", standardize="none")
    constant_delay.Config(dataset="shakespeare")  # left out: fine
