"""Typed experiment configurations, in the shape of the Flax examples: a frozen dataclass per
experiment whose fields are its knobs, validated when it is built; the command line is generated
from it and is the thin layer over it.

A field is declared with :func:`opt` (its default, help text, bounds, the registry its names
come from, whether it is part of the run id). :class:`Base` holds the fields every experiment
shares; an experiment subclasses it::

    @dataclass(frozen=True)
    class Config(Base):
        workers: tuple[int, ...] = opt((4, 8), "worker counts M", low=1)

    cfg = Config(workers=(4, 16), seeds=2)         # Python: a bad value raises ConfigError
    cfg, p = from_argv(Config, ["--workers", "4,16"], "doc")   # the command line: one line

Validation (:func:`validate`, run by ``__post_init__``): every value has its field's type (a list
becomes a tuple, an int a float where a float is declared), numbers are finite and inside their
bounds, names are in their registry (read when the config is built, so names registered after
import count), and no list repeats a value (a repeat would run one cell twice and count it as
two samples). A bad value raises :class:`ConfigError`, a ``ValueError`` naming the field; the
command line turns it into argparse's one-line usage error naming the flag (exit status 2),
before anything runs or is written.

Checks that need the data or a model (:func:`check_model`, :func:`check_memory`,
:func:`refuse_unused`) raise the same error, so ``run(Config(...))`` raises and ``main(argv)``
prints one line (:func:`usage_errors`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import numbers
import os
import resource
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from flax import nnx

from jaxstale import data, models, optimizers
from jaxstale.text import TEXTS, TFDS_TEXTS

from . import runs
from .runs.hosts import fmt_bytes as fmt_bytes
from .runs.hosts import machine_memory as machine_memory

__all__ = [
    "EVAL_HELP",
    "Base",
    "ConfigError",
    "check_memory",
    "check_model",
    "cli",
    "eval_every",
    "from_argv",
    "machine_memory",
    "opt",
    "parser",
    "refuse_unused",
    "run_config",
    "seed_mode_opt",
    "to_argv",
    "usage_errors",
    "validate",
]

C = TypeVar("C", bound="Base")


class ConfigError(ValueError):
    """A bad configuration value: ``field`` names the config field (its flag is
    ``--field-with-dashes``), ``reason`` says what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def opt(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
    kind: str = "value",
    run_id: bool = True,
) -> Any:
    """A config field: its default, help text and constraints.

    Args:
      default: the value when the field is not given (None: the experiment decides, e.g. by
        ``quick``; say which in ``help``).
      help: one line for ``--help`` (the default and the choices are appended).
      low, high, low_open, high_open: bounds of a number or of every number in a list.
      choices: the allowed names, or a function returning them (a registry, read when a config
        is built).
      kind: what a name is, for messages ("model", "method", ...).
      run_id: whether the field is part of the run's config (its hash names the run folder);
        False for where data or results live.
    """
    meta = dict(
        help=help,
        low=low,
        high=high,
        low_open=low_open,
        high_open=high_open,
        choices=choices,
        kind=kind,
        run_id=run_id,
    )
    return dataclasses.field(default=default, metadata=meta)


def _choices(meta: dict[str, Any]) -> list[str] | None:
    choices = meta.get("choices")
    if choices is None:
        return None
    return list(choices() if callable(choices) else choices)


def _shape(annotation: Any) -> tuple[type, bool, bool]:
    """``(element type, is a tuple, may be None)`` of a field's annotation."""
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0]
    if typing.get_origin(annotation) is tuple:
        return typing.get_args(annotation)[0], True, optional
    return annotation, False, optional


def _span(meta: dict[str, Any]) -> str:
    lo, hi = meta["low"], meta["high"]
    left = "(" if meta["low_open"] or lo is None else "["
    right = ")" if meta["high_open"] or hi is None else "]"
    return (
        f"{left}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}{right}"
    )


def _check_one(name: str, kind: type, value: Any, meta: dict[str, Any]) -> Any:
    """One value checked (and converted: an int where a float is declared)."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(name, f"expected True or False, got {value!r}")
        return value
    if kind in (int, float):
        ok = isinstance(value, numbers.Integral if kind is int else numbers.Real)
        if not ok or isinstance(value, bool):
            raise ConfigError(
                name, f"expected {'an int' if kind is int else 'a float'}, got {value!r}"
            )
        value = kind(value)
        lo, hi = meta["low"], meta["high"]
        bad = not math.isfinite(value)
        bad |= lo is not None and (value < lo or (meta["low_open"] and value == lo))
        bad |= hi is not None and (value > hi or (meta["high_open"] and value == hi))
        if bad:
            what = "an int" if kind is int else "a float"
            raise ConfigError(name, f"expected {what} in {_span(meta)}, got {value}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(name, f"expected a string, got {value!r}")
        known = _choices(meta)
        if known is not None and value not in known:
            raise ConfigError(
                name, f"unknown {meta['kind']} {value!r}; choose from: {', '.join(known)}"
            )
        return value
    raise TypeError(f"config field {name}: unsupported type {kind!r}")  # a programming error


def validate(cfg: Any) -> None:
    """Checks and normalises every field of a config dataclass in place (see the module doc).

    Raises:
      ConfigError: the first bad field.
    """
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        kind, is_tuple, optional = _shape(hints[f.name])
        if value is None:
            if not optional:
                raise ConfigError(f.name, "a value is required, got None")
            continue
        meta = dict(f.metadata) or dict(opt(None, "").metadata)
        if is_tuple:
            if isinstance(value, str | bytes) or not isinstance(value, Sequence):
                value = (value,) if kind is str and isinstance(value, str) else value
            if not isinstance(value, Sequence):
                raise ConfigError(f.name, f"expected a list, got {value!r}")
            if not value:
                raise ConfigError(f.name, "expected at least one value, got an empty list")
            items = tuple(_check_one(f.name, kind, v, meta) for v in value)
            seen: list[Any] = []
            for item in items:
                if item in seen:
                    raise ConfigError(
                        f.name,
                        f"{item!r} is given twice; give each value once (a repeat would run "
                        "the same cell twice and count it as two)",
                    )
                seen.append(item)
            value = items
        else:
            value = _check_one(f.name, kind, value, meta)
        object.__setattr__(cfg, f.name, value)


#: the default ``--target`` of a classification task (validation accuracy) and of a language
#: model (validation loss in nats: between Shakespeare's bigram and trigram levels, 2.57 / 1.97)
ACCURACY_TARGET, LOSS_TARGET = 0.95, 2.0


#: why a text takes no --standardize: its inputs are token ids
_TOKENS = "a text's inputs are token ids: there is nothing to standardise (leave it out)"


@dataclass(frozen=True)
class Base:
    """The fields every experiment shares. ``None`` means "the experiment's default" (which
    may depend on ``quick``); ``data_dir``, ``out``, ``force_resume`` and
    ``checkpoint_every`` are not part of the run id."""

    quick: bool = opt(False, "small configuration (< 1 minute): a smoke run, marked as such")
    dataset: str = opt("digits", "dataset name", choices=data.dataset_names, kind="dataset")
    standardize: str = opt(
        "feature",
        "input standardisation with training-set statistics (none keeps raw inputs)",
        choices=data.STANDARDIZE_MODES,
        kind="standardisation",
    )
    data_dir: str | None = opt(
        None, "where prepared TFDS datasets live (default ~/tensorflow_datasets)", run_id=False
    )
    model: tuple[str, ...] | None = opt(
        None, "model name(s)", choices=models.model_names, kind="model"
    )
    steps: int | None = opt(None, "training steps per run", low=1)
    seeds: int | None = opt(None, "number of seeds (default 5; --quick 2)", low=1)
    lrs: tuple[float, ...] | None = opt(
        None, "learning-rate grid; the rate is selected on validation", low=0, low_open=True
    )
    batch_size: int = opt(32, "mini-batch size", low=1)
    target: float | None = opt(
        None,
        "validation metric whose first crossing is the time to target (default: accuracy "
        f"{ACCURACY_TARGET}; on a text dataset, loss {LOSS_TARGET} nats)",
        low=0,
        low_open=True,
    )
    out: str | None = opt(None, "run folder (default results/<experiment>/<id>/)", run_id=False)
    force_resume: bool = opt(
        False,
        "reuse finished cells of --out even if they were computed under different code",
        run_id=False,
    )
    precision: str = opt(
        "float32",
        "a GPT's compute precision: bf16 = bfloat16 matrix products from float32 master "
        "weights (optimizer state, weight versions, loss and norms float32; a GPT's experiments, "
        "not async_bn); its own run folder",
        choices=("float32", "bf16"),
        kind="precision",
    )
    checkpoint_every: int | None = opt(
        None,
        "save a group of runs every K updates in the run folder (orbax); a killed sweep "
        "resumes mid-run, bit for bit",
        low=1,
        run_id=False,
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.text and self.standardize != "feature":
            raise ConfigError("standardize", _TOKENS)
        if self.target is not None and self.target > 1 and not self.text:
            raise ConfigError("target", f"an accuracy must be in (0, 1], got {self.target}")
        if self.out is not None and not self.out.strip():
            raise ConfigError(
                "out",
                "expected a folder path, got an empty string (it would write into the "
                "current folder)",
            )

    @property
    def text(self) -> bool:
        """Whether the dataset is a text or a token folder (a language-modelling task, judged
        on its loss)."""
        return self.dataset in (*TEXTS, *TFDS_TEXTS, "tokens")

    def task_optimizer(self, given: str | None) -> str:
        """``given``, or the task's default optimizer: AdamW for a language model (a GPT's
        recipe; SGD left its smoke runs at the unigram level), SGD with momentum otherwise."""
        return given or ("adamw" if self.text else "sgd")

    @property
    def resolved_target(self) -> float:
        """``target``, or the task's default: accuracy 0.95, a language model's 2.0 nats."""
        if self.target is not None:
            return self.target
        return LOSS_TARGET if self.text else ACCURACY_TARGET


EVAL_HELP = "updates between evaluations (default max(50, steps / 60): 50 up to 3,000 steps)"


def eval_every(given: int | None, steps: int) -> int:
    """Updates between evaluations: ``given``, else ``max(50, steps // 60)`` — at most about 60
    evaluations of the validation and test splits per run (on MNIST-1D's 7,000 held-out examples
    an evaluation every 50 of 9,000 updates cost more than the training)."""
    return given or max(50, steps // 60)


def seed_mode_opt(help: str) -> Any:
    """The ``seed_mode`` field of an experiment that runs seeds (and rates) as lanes: ``auto``,
    ``vmap`` or ``sequential``; ``help`` says what ``auto`` picks there."""
    return opt("auto", help, choices=("auto", "vmap", "sequential"), kind="seed mode")


def flag(field: str) -> str:
    """The command-line flag of a config field."""
    return "--" + field.replace("_", "-")


class _Items(argparse.Action):
    """A list flag: values space- and/or comma-separated (``--model mlp cnn`` or ``mlp,cnn``)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parts = [v.strip() for value in values for v in str(value).split(",")]
        if any(not p for p in parts):
            raise argparse.ArgumentError(self, f"expected a comma-separated list, got {values!r}")
        convert = self.const or str
        items = []
        for part in parts:
            try:
                items.append(convert(part))
            except ValueError:
                what = "an int" if convert is int else f"a {convert.__name__}"
                raise argparse.ArgumentError(
                    self, f"expected {what}, got {part!r} (in {','.join(parts)!r})"
                ) from None
        setattr(namespace, self.dest, items)


def prog_of(module: str) -> str | None:
    """The program name of a usage line: argparse's (``sys.argv[0]``'s name), except
    ``python -m <module>`` for a package run with ``python -m`` (argparse would say
    ``__main__.py``)."""
    prog = os.path.basename(sys.argv[0]) or None
    return f"python -m {module}" if prog == "__main__.py" else prog


def parser(cls: type[Base], description: str | None = None) -> argparse.ArgumentParser:
    """The command line of a config class: one flag per field (``--field-name``), with the
    field's help, default and choices (the registries as they are now). Only the flags given
    appear in the parsed namespace; defaults come from the dataclass."""
    prog = os.path.basename(sys.argv[0]) or None
    if prog == "__main__.py":  # python -m of a package experiment (async_bn, claims)
        prog = f"python -m {cls.__module__}"
    p = runs.OneLineParser(prog=prog, description=description, argument_default=argparse.SUPPRESS)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        kind, is_tuple, _ = _shape(hints[f.name])
        text = meta.get("help", "")
        known = _choices(meta)
        if known is not None:
            text += f"; any of: {', '.join(known)}"
        if f.default not in (None, False):
            shown = ",".join(map(str, f.default)) if is_tuple else f.default
            text += f" (default {shown})"
        text = text.replace("%", "%%")
        if kind is bool and not is_tuple:
            p.add_argument(flag(f.name), action="store_true", help=text)
        elif is_tuple:
            p.add_argument(
                flag(f.name), nargs="+", action=_Items, const=kind, metavar=f.name.upper(),
                help=text,
            )  # fmt: skip
        else:
            p.add_argument(flag(f.name), type=kind, metavar=f.name.upper(), help=text)
    return p


@contextlib.contextmanager
def usage_errors(p: argparse.ArgumentParser) -> Iterator[None]:
    """Turns a :class:`ConfigError` raised inside into ``p``'s one-line usage error naming the
    flag, and a :class:`experiments.runs.RunFolderError` (``--out`` holds another config, or
    results of other code) into one line too (exit status 2)."""
    from .runs import RunFolderError

    try:
        yield
    except ConfigError as e:
        p.error(f"argument {flag(e.field)}: {e.reason}")
    except RunFolderError as e:  # names --out itself
        p.error(str(e))


def from_argv(
    cls: type[C], argv: Sequence[str] | None, description: str | None = None
) -> tuple[C, argparse.ArgumentParser]:
    """Parses a command line into a validated config; a bad flag is one usage line (exit 2)."""
    p = parser(cls, description)
    ns = p.parse_args(argv)
    with usage_errors(p):
        config = cls(**vars(ns))
        if "standardize" in vars(ns) and getattr(config, "text", False):  # given, even the default
            raise ConfigError("standardize", _TOKENS)
        return config, p
    raise AssertionError("not reached")  # pragma: no cover (p.error exits)


def cli(
    cls: type[C],
    run: Callable[[C], list[dict[str, Any]]],
    report: Callable[..., dict[str, Any]],
    argv: Sequence[str] | None,
    description: str | None = None,
) -> dict[str, Any]:
    """An experiment's command line: ``argv`` parsed into ``cls``, then ``report(run(config),
    config, started=...)``. A bad flag, a :class:`ConfigError` raised by ``run`` or ``report``
    and a :class:`experiments.runs.RunFolderError` are one usage line each (exit status 2), before
    anything is written. Returns ``report``'s dict plus ``wall_s`` and ``cpu_s`` (user + sys
    seconds of this process) of the invocation; the CPU time is also printed on stderr."""
    t0 = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    config, p = from_argv(cls, argv, description)
    with usage_errors(p):
        out = report(run(config), config, started=t0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    name = run.__module__.rsplit(".", 1)[-1]
    print(f"[{name}] CPU time {cpu:.0f} s (user + sys)", file=sys.stderr)
    return {**out, "wall_s": time.perf_counter() - t0, "cpu_s": cpu}


def to_argv(cfg: Base) -> list[str]:
    """The command line that builds ``cfg`` (its fields that differ from their defaults, the
    run-id fields only): ``from_argv(type(cfg), to_argv(cfg))`` gives ``cfg`` back, less
    ``data_dir``, ``out``, ``force_resume`` and ``checkpoint_every``."""
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value == f.default or not f.metadata.get("run_id", True):
            continue
        if isinstance(value, bool):
            argv.append(flag(f.name))
            continue
        if isinstance(value, tuple):
            text = ",".join(map(repr if value and isinstance(value[0], float) else str, value))
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        # a value that starts with "-" (a negative λ) would read as a flag: --flag=value
        argv += [f"{flag(f.name)}={text}"] if text.startswith("-") else [flag(f.name), text]
    return argv


def run_config(cfg: Base) -> dict[str, Any]:
    """The fields that are part of the run id, as a plain dict (lists for tuples)."""
    return {
        f.name: list(v) if isinstance(v := getattr(cfg, f.name), tuple) else v
        for f in dataclasses.fields(cfg)
        if f.metadata.get("run_id", True)
    }


def check_model(
    field: str,
    name: str,
    ds: data.Dataset,
    model_kw: dict[str, Any] | None = None,
    optimizer: str | None = None,
) -> int:
    """Raises :class:`ConfigError` (on ``field``) unless model ``name`` builds for ``ds`` and
    maps one batch of its inputs to logits ``[B, num_classes]`` (``[B, T, V]`` for a language
    model; :func:`jaxstale.models.check_logits`: traced abstractly, no compute), and has 2-D
    weights where ``optimizer`` is ``"muon"``; returns its number of parameters."""
    model = _built(field, name, ds, model_kw or {})
    _check_muon(model, name, optimizer)
    return int(models.param_count(model))


def _check_muon(model: Any, name: str, optimizer: str | None) -> None:
    if optimizer == "muon" and not optimizers.muon_weights(nnx.state(model, nnx.Param)):
        raise ConfigError(
            "optimizer",
            f"muon orthogonalises 2-D weights and {name!r} has none outside "
            f"{', '.join(optimizers.EXCLUDE)} (it would be AdamW on every parameter)",
        )


def _built(field: str, name: str, ds: data.Dataset, model_kw: dict[str, Any]) -> Any:
    if name not in models.model_names():
        raise ConfigError(
            field, f"unknown model {name!r}; choose from: {', '.join(models.model_names())}"
        )
    shape = tuple(int(d) for d in ds.x_train.shape[1:])
    try:
        model = models.create(
            name, input_shape=shape, num_classes=ds.num_classes, seed=0, task=ds.task, **model_kw
        )
        where = f"model {name!r} on {ds.name!r}"
        return models.check_logits(model, shape, ds.num_classes, where, task=ds.task)
    except (ValueError, TypeError) as e:  # one message, whichever check said it
        # both names: the model may be the experiment's default, not a flag the user gave
        # ("input_shape must be (H, W, C)" alone did not say that --dataset mnist1d was why)
        said = str(e)
        prefix = "" if said.startswith(f"model {name!r}") else f"model {name!r} on {ds.name!r}: "
        raise ConfigError(field, prefix + said) from None


def check_staged_model(
    field: str,
    name: str,
    ds: data.Dataset,
    model_kw: dict[str, Any],
    cfg: dict[str, Any],
    stages_field: str = "stages",
) -> models.StagedModel:
    """:func:`check_model`, and model ``name`` is a :class:`jaxstale.models.StagedModel` of at
    least ``min(cfg["stages"])`` blocks (else an error on ``stages_field``), with 2-D weights for
    Muon when ``cfg["optimizer"]`` is ``"muon"`` (:func:`jaxstale.optimizers.muon_weights`);
    returns the model (seed 0), built once for every check."""
    model = _built(field, name, ds, model_kw)
    if not isinstance(model, models.StagedModel):
        raise ConfigError(
            field,
            f"a pipeline cuts a model into stages of blocks; {name!r} is a "
            f"{type(model).__name__}, not a jaxstale.models.StagedModel (return one from "
            "its register_model builder)",
        )
    if len(model.blocks) < min(cfg["stages"]):
        raise ConfigError(
            stages_field,
            f"{name!r} has {len(model.blocks)} blocks, fewer than N={min(cfg['stages'])} stages",
        )
    _check_muon(model, name, cfg.get("optimizer"))
    return model


def check_memory(terms: dict[str, float], limit: int | None = None) -> None:
    """Raises :class:`ConfigError` when a configuration cannot fit in memory: ``terms`` maps the
    field that drives each part of the estimate to its bytes (e.g. ``{"workers": M * P * 4,
    "steps": steps * batch * 8}``); the field of the largest part is named. ``limit``: the
    memory available (default :func:`machine_memory`)."""
    total = sum(terms.values())
    limit = machine_memory() if limit is None else limit
    if total > limit:
        field = max(terms, key=lambda k: terms[k])
        raise ConfigError(
            field,
            f"this configuration needs about {fmt_bytes(total)} of memory ({flag(field)}: "
            f"{fmt_bytes(terms[field])}), more than the {fmt_bytes(limit)} this process may use",
        )


def refuse_unused(cfg: Any, unused: dict[str, str], defaults: dict[str, Any] | None = None) -> None:
    """Raises :class:`ConfigError` for a field that was set (differs from its default) but
    would be ignored in this configuration: ``unused`` maps the field to why. ``cfg``: a config
    dataclass, or any object with the fields as attributes (e.g. an argparse namespace) and
    their ``defaults``."""
    if defaults is None:
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for field, why in unused.items():
        if getattr(cfg, field) != defaults[field]:
            raise ConfigError(field, why)
