"""The experiments' common command line and their progress lines."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["cli_parser", "progress"]

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
        setattr(namespace, self.dest, items)


def cli_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The common experiment command line; experiments add their own flags to it.

    Flags (None means "the experiment's default"):

    - ``--quick``: a smaller configuration that finishes in well under a minute.
    - ``--out DIR``: write the run folder exactly here (default ``results/<experiment>/<id>/``).
    - ``--seeds N``: number of seeds (seeds ``0 .. N-1``).
    - ``--dataset NAME``: one of ``jaxstale.data.DATASETS`` (default ``digits``).
    - ``--model NAME [NAME ...]``: one or more model names (``--model mlp cnn`` or ``mlp,cnn``);
      a list of str, or None.
    - ``--steps N``: training steps per run.
    - ``--force-resume``: reuse finished cells of the run folder even when they were computed
      under different code (``RunFolder(..., force_resume=True)``; otherwise such a folder is
      refused with :class:`~jaxstale.runs.StaleResultsError`).

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
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small configuration (< 1 minute)")
    p.add_argument("--out", default=None, help="run folder (default results/<experiment>/<id>/)")
    p.add_argument("--seeds", type=_positive_int, default=None, help="number of seeds")
    p.add_argument("--dataset", default="digits", help="dataset name (default: digits)")
    p.add_argument(
        "--model", nargs="+", action=_ListAction, default=None, help="model name(s), e.g. mlp cnn"
    )
    p.add_argument("--steps", type=_positive_int, default=None, help="training steps per run")
    p.add_argument(
        "--force-resume",
        action="store_true",
        help="reuse finished cells of --out even if they were computed under different code",
    )
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
