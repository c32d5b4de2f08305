"""Run one program as several JAX processes on this machine (multi-controller JAX, locally).

JAX runs a program on several hosts by starting the *same* Python program once per host
(JAX's multi-controller model): each process calls ``jax.distributed.initialize`` first, then
``jax.devices()`` lists the devices of all processes, a mesh built from them spans every process,
and the collectives of a ``jax.shard_map`` (``ppermute``, ``psum``) cross process boundaries.
This module starts such a group of processes on *one* machine, so that multi-process code can be
developed and tested without a cluster. It is only a process launcher: the distributed runtime
(coordination service, heartbeats, cross-process collectives over gloo on the CPU) is JAX's own.

Command line::

    python -m jaxstale.launch --processes 2 --devices-per-process 2 -- pipeline_staleness --quick
    python -m jaxstale.launch --processes 2 --devices-per-process 2 -- path/to/script.py --flag

The target after ``--`` is ``-m MODULE [args]`` (run like ``python -m``), a ``.py`` script
(run like ``python script.py``), or a bare experiment name ``NAME`` (the module
``experiments.NAME`` of this checkout; ``jaxstale.experiments.NAME`` from an installed wheel).
Options: ``--processes P`` (``-n``; at most :func:`max_processes`), ``--devices-per-process D``
(``-d``: emulated CPU devices, ``XLA_FLAGS=--xla_force_host_platform_device_count=D``, so the
global mesh has ``P * D``), ``--port PORT`` (the coordinator's on 127.0.0.1; default a free
one), ``--timeout S`` (JAX's distributed timeouts: start-up, the heartbeat after which a silent
process counts as dead, the shutdown barrier; default JAX's own, 300 / 100 / 300 s in jax
0.10.2) and ``--grace S`` (seconds between SIGTERM and SIGKILL when stopping, default 5).

Each process gets ``JAXSTALE_COORDINATOR=127.0.0.1:PORT``, ``JAXSTALE_NUM_PROCESSES=P``,
``JAXSTALE_PROCESS_ID=i``, ``JAX_PLATFORMS=cpu`` unless set, and the repository on
``PYTHONPATH``; a bootstrap (``python -m jaxstale.launch --child -- TARGET ...``) calls
:func:`initialize` before the target can touch a JAX backend, then runs it with :mod:`runpy`.
Output is forwarded line by line with ``[p0]``, ``[p1]``, ... prefixes. If a process fails, the
others are stopped (SIGTERM, then SIGKILL after ``--grace``) and the launcher exits with its
code (``128 + N`` for signal ``N``); Ctrl-C stops all (130). The children die with the launcher
even under SIGKILL (``PR_SET_PDEATHSIG``), each in its own process group, killed as a whole.

A failing process exits at once: the bootstrap ends it with ``os._exit`` after flushing its
output, because JAX's ``atexit`` handler (``jax.distributed.shutdown``) would otherwise wait in
a shutdown barrier for all the other processes (up to the shutdown timeout) and hide the
failure. A process that succeeds exits normally, through that barrier.

Programs written for this launcher call :func:`jaxstale.distributed.initialize` at the start
(it does nothing in a single process), write results from
:func:`~jaxstale.distributed.is_main_process` only, and bring sharded global arrays to numpy
with :func:`~jaxstale.distributed.process_allgather_to_host`.

On a cluster use the cluster's own launcher instead, with ``--cluster`` as the only option: each
process the cluster starts calls ``jax.distributed.initialize()`` (JAX's own Slurm / Open MPI
detection finds the coordinator, the process count and id), then runs the target as above::

    srun --nodes=2 --ntasks-per-node=4 python -m jaxstale.launch --cluster -- async_workers

(:mod:`jaxstale.distributed` has the details.)

References:
    JAX documentation, "Introduction to multi-controller JAX"
    (https://docs.jax.dev/en/latest/multi_process.html), ``jax.distributed.initialize``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import queue
import re
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from jaxstale._checks import check_int, check_range
from jaxstale.distributed import (
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_TIMEOUT,
    cluster_environment,
)
from jaxstale.distributed import initialize as initialize
from jaxstale.distributed import is_main_process as is_main_process
from jaxstale.distributed import process_allgather_to_host as process_allgather_to_host

__all__ = [
    "initialize",
    "is_main_process",
    "launch",
    "main",
    "process_allgather_to_host",
]

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: the launcher's pid, in a child's environment (the child dies with it)
ENV_LAUNCHER_PID = "JAXSTALE_LAUNCHER_PID"


# --------------------------------------------------------------------------------------------
# The target: what each process runs
# --------------------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _resolve_target(target_argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """``("module", name, args)`` or ``("path", script, args)`` for a target command line."""
    argv = list(target_argv)
    if not argv:
        raise ValueError("launch: no target; give -m MODULE, a script.py or an experiment NAME")
    head, rest = argv[0], argv[1:]
    if head == "-m":
        if not rest:
            raise ValueError("launch: -m needs a module name")
        return "module", rest[0], rest[1:]
    if head.startswith("-m") and len(head) > 2:  # -mpkg.mod, as python accepts
        return "module", head[2:], rest
    if head.endswith(".py") or os.sep in head or Path(head).is_file():
        return "path", head, rest
    if _NAME.fullmatch(head):
        # a checkout's experiments/ folder beside jaxstale/, else the wheel's copy
        checkout = Path(__file__).resolve().parent.parent / "experiments"
        package = "experiments" if (checkout / "__init__.py").is_file() else "jaxstale.experiments"
        return "module", f"{package}.{head}", rest
    raise ValueError(
        f"launch: cannot tell what to run from {head!r}: give -m MODULE, a path to a .py "
        "script, or a bare experiment name NAME (the module experiments.NAME, or "
        "jaxstale.experiments.NAME when installed)"
    )


def _exit_code(code: object) -> int:
    """The process exit code for ``SystemExit(code)``, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(e: BaseException) -> None:
    """The traceback as ``python script.py`` would print it: without this bootstrap's frames."""
    tb = e.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code is _child_main.__code__
        or tb.tb_frame.f_code.co_filename == "<frozen runpy>"
    ):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


#: how a collective fails when a peer process is gone (its sockets closed by its exit)
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
#: seconds such a consequence waits before exiting, so that the launcher sees the peer's exit
#: first (on a loaded machine it could otherwise report this one, not the failure behind it)
PEER_GRACE = 2.0


def _child_main(target_argv: Sequence[str]) -> int:
    """The bootstrap of one launched process: initialize, then run the target like python."""
    _die_with_launcher()
    kind, what, args = _resolve_target(target_argv)
    code = 0
    try:
        initialize()
        if kind == "module":
            sys.argv = [what, *args]  # run_module(alter_sys=True) sets argv[0] to the file
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(what)
            sys.argv = [what, *args]
            sys.path[0] = os.path.dirname(script)  # as `python script.py` does
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt as e:
        _print_user_traceback(e)
        code = 128 + signal.SIGINT
    except BaseException as e:
        _print_user_traceback(e)
        code = 1
        if any(text in str(e) for text in PEER_GONE):
            time.sleep(PEER_GRACE)  # a peer's failure: let the launcher report that one
    if code != 0:
        # Skip atexit: JAX's handler would wait in the shutdown barrier for the other processes
        # (up to the shutdown timeout) and the launcher would not see this failure until then.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return 0


def _cluster_main(target_argv: Sequence[str]) -> int:
    """One process of a job started by a cluster's launcher (Slurm's ``srun``, Open MPI's
    ``mpirun``): ``jax.distributed.initialize()`` with JAX's own cluster detection, then the
    target as the local bootstrap runs it. Outside a cluster: one error line, exit status 2."""
    import jax

    _resolve_target(target_argv)  # a bad target: one error line (main) before JAX starts
    if cluster_environment() is None:
        raise ValueError(
            "launch: --cluster: no cluster environment here (JAX detects Slurm's SLURM_* "
            "variables in an srun job step, Open MPI's OMPI_* under mpirun, Cloud TPU, "
            "Kubernetes): run this under the cluster's launcher, or start processes on this "
            "machine with --processes P --devices-per-process D"
        )
    try:
        jax.distributed.initialize()
    except (ValueError, TypeError) as e:  # JAX's own check of what it detected
        raise ValueError(f"launch: --cluster: jax.distributed.initialize() failed: {e}") from e
    return _child_main(target_argv)


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------


def max_processes() -> int:
    """The most processes :func:`launch` starts here, ``max(8, 4 · CPUs)``: each is a whole JAX
    process, and a count far beyond the cores only forks the machine to a halt."""
    return max(8, 4 * (os.cpu_count() or 1))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _xla_flags(existing: str, devices_per_process: int) -> str:
    """``existing`` without any device-count flag, plus ours."""
    kept = [f for f in shlex.split(existing) if not f.startswith(_DEVICE_COUNT_FLAG)]
    return " ".join([*kept, f"{_DEVICE_COUNT_FLAG}={devices_per_process}"])


def _child_env(
    base: Mapping[str, str],
    *,
    process_id: int,
    processes: int,
    devices_per_process: int,
    port: int,
    timeout: float | None,
) -> dict[str, str]:
    env = dict(base)
    env["XLA_FLAGS"] = _xla_flags(env.get("XLA_FLAGS", ""), devices_per_process)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env[ENV_NUM_PROCESSES] = str(processes)
    env[ENV_PROCESS_ID] = str(process_id)
    if timeout is None:
        env.pop(ENV_TIMEOUT, None)
    else:
        env[ENV_TIMEOUT] = str(timeout)
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the launcher as they are printed
    env[ENV_LAUNCHER_PID] = str(os.getpid())  # the child dies with it (_die_with_launcher)
    # The children import the same jaxstale (and experiments/) as the launcher, whatever an
    # installed copy elsewhere says.
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])
    return env


def _die_with_launcher() -> None:
    """In a launched child, first: die with the launcher (``PR_SET_PDEATHSIG``; its pid in
    :data:`ENV_LAUNCHER_PID`), or exit if it already died. Not a ``Popen(preexec_fn=...)``:
    Python between fork and exec is unsafe in a threaded (JAX) parent, and JAX warns of it."""
    parent = os.environ.pop(ENV_LAUNCHER_PID, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    zero = ctypes.c_ulong(0)
    ctypes.CDLL(None, use_errno=True).prctl(
        ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), zero, zero, zero
    )
    if os.getppid() != int(parent):
        os._exit(1)


def _signal_text(returncode: int) -> str:
    if returncode >= 0:
        return f"code {returncode}"
    names = {s.value: s.name for s in signal.Signals}
    return f"signal {-returncode} ({names.get(-returncode, 'unknown')})"


class _Stop(Exception):
    """A signal asked the launcher to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM / SIGHUP raise :class:`_Stop` in the main thread, SIGINT KeyboardInterrupt —
    also when SIGINT was ignored at start-up (a non-interactive shell starts background jobs
    so, and Python then installs no handler): the launcher is a supervisor, a SIGINT sent to it
    means stop the group. Elsewhere (not the main thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise _Stop(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_print_lock = threading.Lock()


def _forward(pipe: IO[bytes], prefix: str, stream_name: str) -> None:
    """Copy ``pipe`` line by line to ``sys.<stream_name>``, each line prefixed."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            stream = getattr(sys, stream_name)
            with _print_lock:
                stream.write(prefix + line)
                stream.flush()


def _say(message: str) -> None:
    with _print_lock:
        sys.stderr.write(f"launch: {message}\n")
        sys.stderr.flush()


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The child's process group id is its pid (process_group=0). Linux does not hand out a pid
    # that is still some group's id, so this cannot hit an unrelated group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop_all(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM each process group still running, then SIGKILL whatever is left after grace."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _killpg(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in procs:  # also stragglers of exited children (their groups)
        _killpg(p, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def launch(
    target_argv: Sequence[str],
    *,
    processes: int,
    devices_per_process: int,
    port: int | None = None,
    timeout: float | None = None,
    grace: float = 5.0,
) -> int:
    """Run ``target_argv`` as ``processes`` JAX processes on this machine; return the exit code.

    The Python form of ``python -m jaxstale.launch`` (see the module documentation): the
    children's output is forwarded to ``sys.stdout`` / ``sys.stderr`` with ``[pI]`` prefixes,
    and a failing process stops the group.

    Args:
        target_argv: what to run: ``["-m", "module", *args]``, ``["script.py", *args]`` or
            ``["NAME", *args]`` for the module ``experiments.NAME``.
        processes: number of processes (``>= 1``).
        devices_per_process: emulated CPU devices per process (``>= 1``).
        port: coordinator port on 127.0.0.1; default a free one.
        timeout: JAX's distributed timeouts in seconds (start-up connection, heartbeat,
            shutdown barrier); ``None`` keeps JAX's defaults.
        grace: seconds between SIGTERM and SIGKILL when the group is stopped.

    Returns:
        0 if every process exited with 0; otherwise the exit code of the first process that
        failed (``128 + N`` if it died of signal ``N``; the processes stopped because of it do
        not count), or ``128 + N`` if the launcher itself was stopped by signal ``N``
        (130 for Ctrl-C).

    Raises:
        ValueError: counts, port or times out of range, or a target that names nothing
            runnable; TypeError: a count that is not an int.

    Example:
        >>> launch(["-m", "my_experiment"], processes=2, devices_per_process=2)  # doctest: +SKIP
        0
    """
    check_int(devices_per_process, "devices_per_process", "launch", 1)
    check_range(check_int(processes, "processes", "launch", 1), "processes", "launch", 1,
                max_processes(), high_open=False, hint=" (4 per CPU, at least 8)")  # fmt: skip
    if port is not None:
        check_range(
            check_int(port, "port", "launch", 1), "port", "launch", 1, 65535, high_open=False
        )
    if timeout is not None and not timeout > 0:
        raise ValueError(f"launch: timeout must be positive seconds or None, got {timeout!r}")
    if not grace >= 0:
        raise ValueError(f"launch: grace must be >= 0 seconds, got {grace!r}")
    _resolve_target(target_argv)  # fail here, not P times in the children
    port = _free_port() if port is None else port
    _say(
        f"{processes} process(es) x {devices_per_process} device(s), coordinator "
        f"127.0.0.1:{port}: {shlex.join(target_argv)}"
    )
    procs: list[subprocess.Popen[bytes]] = []
    threads: list[threading.Thread] = []
    result: int | None = None
    try:
        with _stop_on_signals():
            try:
                for i in range(processes):
                    env = _child_env(
                        os.environ,
                        process_id=i,
                        processes=processes,
                        devices_per_process=devices_per_process,
                        port=port,
                        timeout=timeout,
                    )
                    procs.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "jaxstale.launch",
                                "--child",
                                "--",
                                *target_argv,
                            ],
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            process_group=0,
                        )
                    )
                exits: queue.Queue[tuple[int, int]] = queue.Queue()
                for i, p in enumerate(procs):
                    waiter = threading.Thread(
                        target=lambda i=i, p=p: exits.put((i, p.wait())), daemon=True
                    )
                    waiter.start()
                    for pipe, name in ((p.stdout, "stdout"), (p.stderr, "stderr")):
                        assert pipe is not None
                        t = threading.Thread(
                            target=_forward, args=(pipe, f"[p{i}] ", name), daemon=True
                        )
                        t.start()
                        threads.append(t)
                result = _watch(procs, exits, grace)
            except (KeyboardInterrupt, _Stop) as e:
                signum = e.signum if isinstance(e, _Stop) else signal.SIGINT
                result = 128 + signum
                with contextlib.suppress(KeyboardInterrupt, _Stop):  # a 2nd one: SIGKILL now
                    _interrupted(procs, signum, grace)
    finally:
        if result is None or result != 0:
            for p in procs:  # whatever happened (even an exception here): no orphans
                _killpg(p, signal.SIGKILL)
        for t in threads:
            t.join(timeout=5)
    assert result is not None
    return result


def _interrupted(procs: Sequence[subprocess.Popen[bytes]], signum: int, grace: float) -> None:
    alive = sum(p.poll() is None for p in procs)
    _say(f"stopped by {signal.Signals(signum).name}; stopping {alive} process(es)")
    _stop_all(procs, grace)


def _watch(
    procs: Sequence[subprocess.Popen[bytes]], exits: queue.Queue[tuple[int, int]], grace: float
) -> int:
    """Wait for every process; on the first failure stop the others. The exit code.

    ``exits`` receives ``(index, returncode)`` from one waiting thread per process, in the
    order the processes end, so that the failure reported is the first one, not a later one
    it caused (a peer's collective fails as soon as this process is gone).
    """
    pending = set(range(len(procs)))
    while pending:
        try:
            i, code = exits.get(timeout=0.1)  # (a timeout keeps signals handled promptly)
        except queue.Empty:
            continue
        pending.discard(i)
        if code != 0:
            message = f"process {i} exited with {_signal_text(code)}"
            if pending:
                message += f"; stopping the other {len(pending)} process(es)"
            _say(message)
            _stop_all(procs, grace)
            return code if code > 0 else 128 - code
    return 0


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jaxstale.launch",
        description="Run a program as several JAX processes on this machine (emulated CPU "
        "devices; JAX's own multi-controller runtime).",
        usage="%(prog)s --processes P --devices-per-process D [--port PORT] [--timeout S] "
        "[--grace S] -- (-m MODULE | script.py | NAME) [args ...]",
    )
    p.add_argument("-n", "--processes", type=int, required=True, help="number of processes")
    p.add_argument(
        "-d",
        "--devices-per-process",
        type=int,
        required=True,
        help="emulated CPU devices per process (XLA_FLAGS device count)",
    )
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: free)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="JAX distributed timeouts in seconds: start-up, heartbeat, shutdown "
        "(default: JAX's own)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when stopping the group (default 5)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m jaxstale.launch [options] -- TARGET [args]``.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        The exit code (see :func:`launch`).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        _parser().error("put the program to run after --, e.g. -- -m experiments.async_workers")
    cut = args.index("--")
    options, target = args[:cut], args[cut + 1 :]
    if options == ["--child"]:
        return _child_main(target)
    if options == ["--cluster"]:
        try:
            return _cluster_main(target)
        except ValueError as e:
            print(" ".join(str(e).split()), file=sys.stderr)
            return 2
    ns = _parser().parse_args(options)
    try:
        return launch(
            target,
            processes=ns.processes,
            devices_per_process=ns.devices_per_process,
            port=ns.port,
            timeout=ns.timeout,
            grace=ns.grace,
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Delegate to the imported module so that a program calling jaxstale.launch.initialize()
    # sees one copy of this module, not a second one named __main__.
    from jaxstale.launch import main as _main

    sys.exit(_main())
