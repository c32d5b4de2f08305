"""The experiments' common command line and their progress lines."""

from __future__ import annotations

import argparse
import math
import sys
import time
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from jaxstale.data import STANDARDIZE_MODES

__all__ = [
    "OneLineParser",
    "cli_parser",
    "float_list",
    "int_list",
    "name_list",
    "number",
    "progress",
]

T = TypeVar("T")


def _fmt_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}min"


def progress(
    iterable: Iterable[T],
    total: int | None = None,
    desc: str = "",
    *,
    file: Any = None,
) -> Iterator[T]:
    """Iterates with progress: a tqdm bar on a terminal, else one log line per item with ETA.

    The log line (``[desc] 3/24 done, 12s elapsed, ETA 84s``) suits CI logs and files, where a
    redrawn bar would be noise. Output goes to stderr.

    Args:
      iterable: the items.
      total: number of items (default: ``len(iterable)`` when available).
      desc: label.
      file: stream (default ``sys.stderr``).

    Returns:
      An iterator over the items.
    """
    stream = file if file is not None else sys.stderr
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if getattr(stream, "isatty", lambda: False)():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, total=total, desc=desc, file=stream)
        return
    start = time.perf_counter()
    for i, item in enumerate(iterable, 1):
        yield item
        elapsed = time.perf_counter() - start
        eta = f", ETA {_fmt_s(elapsed / i * (total - i))}" if total else ""
        of = f"/{total}" if total else ""
        print(f"[{desc}] {i}{of} done, {_fmt_s(elapsed)} elapsed{eta}", file=stream, flush=True)


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line on stderr, ``<prog>: error:
    <message>``, exit status 2: bad input is reported without the usage block (``--help``
    shows it), so a script's log holds the error and nothing else."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class _ListAction(argparse.Action):
    """Collects values given space- and/or comma-separated: ``--model mlp cnn`` or ``mlp,cnn``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = [v for value in values for v in str(value).split(",") if v]
        repeated = _repeated(items)
        if repeated is not None:
            raise argparse.ArgumentError(self, f"{repeated!r} is given twice; give each once")
        setattr(namespace, self.dest, items)


def _repeated(items: Iterable[Any]) -> Any:
    """The first item that occurs twice (a repeated seed, rate or name would run the same cell
    twice and count it as two samples), or None."""
    seen: list[Any] = []
    for item in items:
        if item in seen:
            return item
        seen.append(item)
    return None


def _no_repeats(values: list[Any], text: str) -> list[Any]:
    repeated = _repeated(values)
    if repeated is not None:
        raise argparse.ArgumentTypeError(
            f"{repeated!r} is given twice in {text!r}; give each value once (a repeat would run "
            f"the same cell twice and count it as two)"
        )
    return values


def cli_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The common experiment command line; experiments add their own flags to it.

    Flags (None means "the experiment's default"):

    - ``--quick``: a smaller configuration that finishes in well under a minute.
    - ``--out DIR``: write the run folder exactly here (default ``results/<experiment>/<id>/``).
    - ``--seeds N``: number of seeds (seeds ``0 .. N-1``).
    - ``--dataset NAME``: one of ``jaxstale.data.dataset_names()`` (default ``digits``).
    - ``--standardize MODE``: ``feature`` (default), ``channel`` or ``none`` (raw inputs), as
      ``jaxstale.data.load(..., standardize=)``.
    - ``--data-dir DIR``: where prepared TFDS data lives (``jaxstale.data.load(data_dir=)``).
    - ``--model NAME [NAME ...]``: one or more model names (``--model mlp cnn`` or ``mlp,cnn``);
      a list of str, or None.
    - ``--steps N``: training steps per run.
    - ``--force-resume``: reuse finished cells of the run folder even when they were computed
      under different code (``RunFolder(..., force_resume=True)``; otherwise such a folder is
      refused with :class:`~experiments.runs.StaleResultsError`).

    Args:
      description: the experiment's one-line description (shown by ``--help``).

    Returns:
      An ``argparse.ArgumentParser``.

    Example:
      >>> args = cli_parser("demo").parse_args(["--quick", "--model", "mlp,cnn", "--seeds", "2"])
      >>> args.quick, args.model, args.seeds, args.dataset, args.steps, args.out
      (True, ['mlp', 'cnn'], 2, 'digits', None, None)
      >>> args.force_resume
      False
    """
    p = OneLineParser(description=description)
    p.add_argument("--quick", action="store_true", help="small configuration (< 1 minute)")
    p.add_argument(
        "--out",
        type=_folder,
        default=None,
        help="run folder (default results/<experiment>/<id>/)",
    )
    p.add_argument(
        "--seeds", type=number(int, low=1), default=None, help="number of seeds (default 5)"
    )
    p.add_argument(
        "--dataset",
        type=_dataset_name,
        default="digits",
        help="dataset name (default: digits; jaxstale.data.dataset_names())",
    )
    p.add_argument(
        "--standardize",
        default="feature",
        choices=STANDARDIZE_MODES,
        help="input standardisation with training-set statistics (default feature; none keeps "
        "raw inputs, for comparison)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where prepared TFDS datasets live (default ~/tensorflow_datasets); not part of "
        "the run id",
    )
    p.add_argument(
        "--model", nargs="+", action=_ListAction, default=None, help="model name(s), e.g. mlp cnn"
    )
    p.add_argument("--steps", type=number(int, low=1), default=None, help="training steps per run")
    p.add_argument(
        "--force-resume",
        action="store_true",
        help="reuse finished cells of --out even if they were computed under different code",
    )
    return p


def _folder(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "expected a folder path, got an empty string (it would write into the current folder)"
        )
    return text


def _dataset_name(text: str) -> str:
    from jaxstale.data import dataset_names

    if text not in dataset_names():
        raise argparse.ArgumentTypeError(
            f"unknown dataset {text!r}; choose from: {', '.join(dataset_names())}"
        )
    return text


def number(
    kind: type = float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], Any]:
    """An argparse ``type`` that parses one ``int`` or finite ``float`` in a range.

    Out-of-range or malformed text becomes argparse's one-line usage error (exit status 2)
    before anything runs, e.g. ``argument --lr: expected a float in (0, inf), got -1.0``.

    Args:
        kind: ``int`` or ``float``.
        low, high: bounds (None: unbounded).
        low_open, high_open: exclude the bound.

    Example:
        >>> number(float, low=0, low_open=True)("0.5")
        0.5
        >>> number(int, low=1)("0")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: expected an int in [1, inf), got 0
    """
    lo = "(" if low_open or low is None else "["
    hi = ")" if high_open or high is None else "]"
    span = (
        f"{lo}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}{hi}"
    )
    what = f"expected {'an int' if kind is int else 'a float'} in {span}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None
        bad = not math.isfinite(value)
        bad |= low is not None and (value < low or (low_open and value == low))
        bad |= high is not None and (value > high or (high_open and value == high))
        if bad:
            raise argparse.ArgumentTypeError(f"{what}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _list(item: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        parts = [t.strip() for t in str(text).split(",")]
        if not parts or any(not t for t in parts):
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {what}, got {text!r}"
            )
        try:
            values = [item(t) for t in parts]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in {text!r})") from None
        return _no_repeats(values, text)

    parse.__name__ = "list"
    return parse


def int_list(**bounds: Any) -> Callable[[str], list[int]]:
    """An argparse ``type`` for ``"1,4,16"``: ints, each checked like :func:`number`, each
    given once (every list flag refuses repeats: they would fake extra samples).

    Example:
        >>> int_list(low=1)("1,4,16")
        [1, 4, 16]
        >>> int_list(low=1)("4,4")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: 4 is given twice in '4,4'; give each value once ...)
    """
    return _list(number(int, **bounds), "ints")


def float_list(**bounds: Any) -> Callable[[str], list[float]]:
    """An argparse ``type`` for ``"0.01,0.03"``: floats, each checked like :func:`number`.

    Example:
        >>> float_list(low=0, low_open=True)("0.01,0.03")
        [0.01, 0.03]
    """
    return _list(number(float, **bounds), "floats")


def name_list(
    choices: Iterable[str] | Callable[[], Iterable[str]], what: str = "name"
) -> Callable[[str], list[str]]:
    """An argparse ``type`` for ``"a,b"``: names, each one of ``choices`` (a collection, or a
    function returning it, read when parsing: registries may grow after the parser is built).

    Example:
        >>> name_list(["asgd", "sgd"], "method")("sgd,asgd")
        ['sgd', 'asgd']
        >>> name_list(["asgd"], "method")("sdg")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: unknown method 'sdg'; choose from: asgd
    """

    def item(text: str) -> str:
        known = list(choices() if callable(choices) else choices)
        if text not in known:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; choose from: {', '.join(known)}"
            )
        return text

    def parse(text: str) -> list[str]:
        parts = [t.strip() for t in str(text).split(",")]
        if any(not t for t in parts):
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {what}s, got {text!r}"
            )
        return _no_repeats([item(t) for t in parts], text)

    parse.__name__ = "list"
    return parse
