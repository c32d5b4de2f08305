"""jaxstale.launch: several JAX processes on this machine forming one device mesh.

The end-to-end tests start real process groups (2 processes x 2 emulated CPU devices, JAX's
distributed runtime with gloo collectives); each takes a few seconds, mostly Python and JAX
start-up. The test process itself has 8 devices (root conftest.py): the children must get 2
each from the launcher, which the toy program checks.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import pytest

from jaxstale import distributed
from jaxstale import launch as L

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# Every process: initialize (again: idempotent), build the global 4-device mesh, make a global
# array from its own half of the data, ppermute + psum in a shard_map, check and print.
TOY = """
import sys
import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxstale import launch
from jaxstale.mesh import make_mesh

assert launch.initialize()
assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (2, 2, 4)
mesh = make_mesh(4, "x")
sharding = NamedSharding(mesh, P("x"))
full = np.arange(4, dtype=np.float32)
mine = sorted(sharding.addressable_devices_indices_map((4,)).values(), key=lambda s: s[0].start)
x = jax.make_array_from_process_local_data(sharding, np.concatenate([full[s] for s in mine]))
assert not x.is_fully_addressable


def f(x):
    y = lax.ppermute(x, "x", [(i, (i + 1) % 4) for i in range(4)])  # y[i] = x[i - 1]
    z = 10 * y + x
    return z, lax.psum(z, "x")


z, total = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P())))(x)
z = launch.process_allgather_to_host(z)
total = float(launch.process_allgather_to_host(total).reshape(-1)[0])
np.testing.assert_array_equal(z, [30.0, 1.0, 12.0, 23.0])
assert total == 66.0
print(f"RESULT process={jax.process_index()} z={z.tolist()} total={total} "
      f"main={launch.is_main_process()} argv={sys.argv[1:]}")
"""

# Both processes print their pid and meet at a barrier; then process 1 does WHAT and process 0
# waits in a collective that process 1 never joins (or sleeps).
HANG = """
import os, sys, time
import jax
from jax.experimental import multihost_utils

print(f"PID {{jax.process_index()}} {{os.getpid()}}", flush=True)
multihost_utils.sync_global_devices("pids printed")
print(f"READY {{jax.process_index()}}", flush=True)
if jax.process_index() == 1:
    {what}
    time.sleep(300)
else:
    multihost_utils.sync_global_devices("process 1 never comes")
    time.sleep(300)
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _pids(text: str) -> dict[int, int]:
    return {int(i): int(p) for i, p in re.findall(r"\] PID (\d) (\d+)", text)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pids, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


class _Launcher:
    """``python -m jaxstale.launch`` in the background, its merged output collected live."""

    def __init__(self, *args: str, ignore_sigint: bool = False):
        # ignore_sigint: started as a non-interactive shell starts a background job (SIGINT
        # ignored, so Python installs no KeyboardInterrupt handler), as CI may start the tests.
        # An ignored signal stays ignored across exec: ignored here around the start, not in a
        # preexec_fn (Python between fork and exec in this JAX process: JAX's fork warning)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore_sigint else None
        try:
            self.proc = subprocess.Popen(
                [PY, "-m", "jaxstale.launch", *args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, count: int = 1, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while len(re.findall(pattern, self.text)) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise AssertionError(f"no {count}x {pattern!r} in:\n{self.text}")
            time.sleep(0.05)

    def wait(self, within: float) -> int:
        try:
            rc = self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {within} s:\n{self.text}") from None
        self._reader.join(timeout=5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _cleanup(pids):
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)


# --- end to end ------------------------------------------------------------------------------


def test_two_processes_form_one_mesh(tmp_path):
    """The CLI: 2 processes x 2 devices, ppermute + psum across them, prefixed output."""
    script = _script(tmp_path, "toy.py", TOY)
    t0 = time.monotonic()
    cli = ["--processes", "2", "--devices-per-process", "2", "--timeout", "60"]
    r = subprocess.run(
        [PY, "-m", "jaxstale.launch", *cli, "--", str(script), "--flag", "a b"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for i in (0, 1):
        line = (
            f"[p{i}] RESULT process={i} z=[30.0, 1.0, 12.0, 23.0] total=66.0 main={i == 0} "
            "argv=['--flag', 'a b']\n"
        )
        assert line in r.stdout, r.stdout
    assert time.monotonic() - t0 < 60


def test_python_api_runs_a_module(tmp_path, capsys, monkeypatch, recwarn):
    """launch() with a ``-m`` target; children find the module through the inherited cwd. From
    this (threaded, JAX) process, without Python code between fork and exec: no "os.fork() was
    called" warning (the children set their own death signal)."""
    _script(tmp_path, "toy_module.py", TOY)
    monkeypatch.chdir(tmp_path)
    jax.numpy.zeros(2).block_until_ready()  # this process's backend (and its threads) running
    rc = L.launch(["-m", "toy_module", "x"], processes=2, devices_per_process=2)
    assert not [w for w in recwarn if "fork" in str(w.message)], [str(w.message) for w in recwarn]
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[p0] RESULT process=0 z=[30.0, 1.0, 12.0, 23.0] total=66.0 main=True argv=['x']" in out
    assert "[p1] RESULT process=1" in out


@pytest.mark.slow  # long: waits until the launcher stops the process blocked in a collective
def test_a_failing_process_stops_the_group(tmp_path):
    script = _script(tmp_path, "fail.py", HANG.format(what="sys.exit(3)"))
    t0 = time.monotonic()
    run = _Launcher("-n", "2", "-d", "2", "--", str(script))
    rc = run.wait(within=60)
    out = run.text
    assert rc == 3, out
    assert "launch: process 1 exited with code 3; stopping the other 1 process(es)" in out
    pids = _pids(out)
    assert set(pids) == {0, 1}, out
    assert _wait_dead(pids.values()) == []
    assert time.monotonic() - t0 < 45


def test_a_killed_process_stops_the_group(tmp_path):
    """SIGKILL process 1 while process 0 waits for it in a collective."""
    script = _script(tmp_path, "hang.py", HANG.format(what="pass"))
    run = _Launcher("-n", "2", "-d", "2", "--", str(script))
    try:
        run.wait_for(r"READY \d", count=2)  # a C++ log line may interleave with it
        pids = _pids(run.text)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        rc = run.wait(within=30)
        elapsed = time.monotonic() - t0
    finally:
        run.kill()
        _cleanup(_pids(run.text).values())
    out = run.text
    assert rc == 128 + signal.SIGKILL, out
    assert (
        "launch: process 1 exited with signal 9 (SIGKILL); stopping the other 1 process(es)" in out
    )
    assert _wait_dead(pids.values()) == [], out
    assert elapsed < 15, elapsed  # SIGTERM ends process 0 at once (no 5 s SIGKILL grace)


@pytest.mark.parametrize(
    "sig",
    [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGKILL],  # ctrl-c: make test-slow
    ids=["ctrl-c", "sigkill"],
)
def test_children_die_with_the_launcher(tmp_path, sig):
    """Ctrl-C stops the group (exit 130), even when the launcher started with SIGINT ignored
    (a background job); SIGKILL of the launcher kills it (PDEATHSIG)."""
    script = _script(tmp_path, "hang.py", HANG.format(what="pass"))
    run = _Launcher("-n", "2", "-d", "2", "--", str(script), ignore_sigint=sig == signal.SIGINT)
    try:
        run.wait_for(r"READY \d", count=2)  # a C++ log line may interleave with it
        pids = _pids(run.text)
        run.proc.send_signal(sig)
        rc = run.wait(within=30)
        left = _wait_dead(pids.values())
    finally:
        run.kill()
        _cleanup(_pids(run.text).values())
    assert left == [], run.text
    if sig == signal.SIGINT:
        assert rc == 130, run.text
        assert "launch: stopped by SIGINT; stopping 2 process(es)" in run.text
    else:
        assert rc == -signal.SIGKILL


@pytest.mark.slow  # make test: under its 8-minute budget
def test_cluster_mode_joins_the_job_its_cluster_started(tmp_path):
    """``--cluster``: JAX's own cluster detection, here a Slurm job of two tasks emulated on
    this machine (the variables srun sets); the two processes form one 4-device mesh."""
    script = _script(
        tmp_path,
        "who.py",
        """
        import jax
        print(f"OK {jax.process_index()} {jax.process_count()} {jax.device_count()}", flush=True)
        """,
    )
    procs = []
    for i in range(2):
        env = {
            **os.environ,
            "SLURM_JOB_ID": str(1000 + os.getpid() % 3000),  # the coordinator port: 61440 + id
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(i),
            "SLURM_LOCALID": str(i),
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        }
        cmd = [PY, "-m", "jaxstale.launch", "--cluster", "--", str(script)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip().splitlines()[-1] for o in outs] == ["OK 0 2 4", "OK 1 2 4"]


# What JAX's cluster detection reads (jax._src.clusters): Slurm's, Open MPI's, Kubernetes'.
CLUSTER_VARIABLES = ("SLURM_", "OMPI_", "KUBERNETES_SERVICE_HOST", "JAX_COORDINATOR")


def test_cluster_mode_outside_a_cluster_is_one_error_line(tmp_path):
    """Not JAX's "coordinator_address should be defined" traceback: one line, exit status 2."""
    script = _script(tmp_path, "never.py", "print('RAN', flush=True)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLUSTER_VARIABLES)}
    cmd = [PY, "-m", "jaxstale.launch", "--cluster", "--", str(script)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "RAN" not in done.stdout and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: --cluster: no cluster"), lines


# --- in this process -------------------------------------------------------------------------


def test_cluster_environment_is_what_jax_would_detect(monkeypatch):
    for name in [k for k in os.environ if k.startswith(CLUSTER_VARIABLES)]:
        monkeypatch.delenv(name)
    assert distributed.cluster_environment() is None
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "1531576320.0;tcp://10.0.0.1:34911")
    assert distributed.cluster_environment() == "ompi"


def test_initialize_is_a_noop_without_the_variables(monkeypatch):
    for name in (L.ENV_COORDINATOR, L.ENV_NUM_PROCESSES, L.ENV_PROCESS_ID, L.ENV_TIMEOUT):
        monkeypatch.delenv(name, raising=False)
    assert L.initialize() is False
    assert L.initialize() is False
    assert not jax.distributed.is_initialized()
    assert L.is_main_process()


def test_initialize_rejects_half_set_variables(monkeypatch):
    monkeypatch.setenv(L.ENV_COORDINATOR, "127.0.0.1:1")
    monkeypatch.delenv(L.ENV_NUM_PROCESSES, raising=False)
    with pytest.raises(ValueError, match="JAXSTALE_NUM_PROCESSES"):
        L.initialize()


def test_process_allgather_to_host_in_one_process():
    x = jax.device_put(
        jax.numpy.arange(8.0),
        jax.sharding.NamedSharding(
            jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,)),
            jax.sharding.PartitionSpec("d"),
        ),
    )
    out = L.process_allgather_to_host({"x": x, "s": 3})
    assert out["x"].tolist() == list(range(8)) and out["s"].shape == ()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["-m", "pkg.mod", "--a"], ("module", "pkg.mod", ["--a"])),
        (["-mpkg.mod"], ("module", "pkg.mod", [])),
        (["run.py", "x"], ("path", "run.py", ["x"])),
        (["dir/run"], ("path", "dir/run", [])),
        (
            ["pipeline_staleness", "--quick"],
            ("module", "experiments.pipeline_staleness", ["--quick"]),
        ),
    ],
)
def test_targets(argv, expected):
    assert L._resolve_target(argv) == expected


@pytest.mark.parametrize("argv", [[], ["-m"], ["a.b"], ["--quick"]])
def test_bad_targets(argv):
    with pytest.raises(ValueError, match="launch:"):
        L._resolve_target(argv)


def test_child_environment(monkeypatch):
    base = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false",
        "PYTHONPATH": "/elsewhere",
        "JAX_PLATFORMS": "cpu,cuda",
    }
    env = L._child_env(
        base, process_id=1, processes=3, devices_per_process=2, port=1234, timeout=7.5
    )
    assert env["XLA_FLAGS"] == (
        "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2"
    )
    assert env["JAX_PLATFORMS"] == "cpu,cuda"  # the user's choice is kept
    assert (env[L.ENV_COORDINATOR], env[L.ENV_NUM_PROCESSES], env[L.ENV_PROCESS_ID]) == (
        "127.0.0.1:1234",
        "3",
        "1",
    )
    assert env[L.ENV_TIMEOUT] == "7.5"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    env = L._child_env({}, process_id=0, processes=1, devices_per_process=4, port=1, timeout=None)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu" and L.ENV_TIMEOUT not in env


def test_cli_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        L.main(["-n", "2", "-d", "2", "experiments.x"])
    assert e.value.code == 2 and "after --" in capsys.readouterr().err
    assert L.main(["-n", "2", "-d", "2", "--", "a.b"]) == 2
    assert "cannot tell what to run" in capsys.readouterr().err
    with pytest.raises(ValueError, match="processes"):
        L.launch(["x"], processes=0, devices_per_process=1)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-n", "10000", "-d", "1"], "processes must be in [1, "),  # forked without bound before
        (["-n", "2", "-d", "1", "--port", "99999"], "port must be in [1, 65535]"),
        (["-n", "2", "-d", "1", "--port", "0"], "port must be >= 1"),
    ],
)
def test_sizes_out_of_range_are_one_line_before_anything_starts(argv, words, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(L.subprocess, "Popen", lambda *a, **k: started.append(a))
    assert L.main([*argv, "--", "-m", "experiments.async_workers"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not started


@pytest.mark.parametrize(
    ("message", "waits"),
    [("Gloo AllGather failed: Read error: Connection reset by peer", True), ("boom", False)],
)
def test_a_collective_that_lost_its_peer_exits_after_the_peer(
    tmp_path, monkeypatch, message, waits
):
    """A process whose collective failed because its peer is gone waits PEER_GRACE before it
    exits (code 1), so that the launcher reports the peer's failure, not this consequence of it
    (the race a loaded machine lost); any other failure exits at once."""
    script = _script(tmp_path, "lost.py", f"raise RuntimeError({message!r})\n")
    slept, exited = [], []
    monkeypatch.setattr(L, "initialize", lambda: None)
    monkeypatch.setattr(L.time, "sleep", slept.append)
    monkeypatch.setattr(L.os, "_exit", exited.append)
    monkeypatch.setattr(L.sys, "argv", list(sys.argv))
    monkeypatch.setattr(L.sys, "path", list(sys.path))
    L._child_main([str(script)])
    assert exited == [1]
    assert slept == ([L.PEER_GRACE] if waits else [])
