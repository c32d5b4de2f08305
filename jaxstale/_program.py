"""Running a function as a process's whole program: the console scripts' and ``python -m``'s
entry, where Ctrl-C must end the process at once instead of through the interpreter's teardown.

Ctrl-C lands between asynchronous dispatches: a compilation still running on XLA's thread pool
when the interpreter frees the PJRT client dereferences freed devices (``SIGSEGV`` in
``xla::ifrt::SingleDeviceSharding::Create``, under ``PjRtCompiler::CompileAndLoad``; exit 139
after the right message, 4 times in 6 on a ``local_sgd --quick`` sweep). Every file a sweep
writes is complete (atomic) before its handler reports the interrupt, so nothing is lost by
leaving without the teardown; standard output and error are flushed first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["INTERRUPTED", "run_as_program"]

#: the exit status of a process ended by Ctrl-C (128 + SIGINT), as a shell reports it
INTERRUPTED = 130


def _leave(message: str | None) -> NoReturn:
    if message:
        print(message, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say
            pass
    os._exit(INTERRUPTED)


def run_as_program(main: Callable[[], object]) -> NoReturn:
    """Runs ``main()`` and exits the process with its status: an int it returns, else 0 (an
    experiment's ``main`` returns its results).

    ``KeyboardInterrupt``, or ``SystemExit(130)`` (a sweep's Ctrl-C handler, which has said how
    many cells it saved), ends the process with status 130 through ``os._exit``, after flushing
    standard output and error; any other ``SystemExit`` (``--help``, a usage error) leaves as
    usual. Only for the top of a process: inside a test or a notebook, call ``main`` itself.
    """
    try:
        status = main()
    except KeyboardInterrupt:
        _leave("interrupted")
    except SystemExit as e:
        if e.code == INTERRUPTED:
            _leave(None)
        raise
    sys.exit(status if isinstance(status, int) and not isinstance(status, bool) else 0)
