"""The mesh executors on a mesh spanning two processes, against the one-process emulators.

``python -m jaxstale.launch --processes 2 --devices-per-process 4`` starts a group of two JAX
processes (gloo collectives on the CPU) whose 8 devices form one global mesh; the program runs
the pipeline, asynchronous and local-SGD mesh executors on meshes holding devices of both processes,
and process 0 writes the results as JSON. This test process runs the same cases (the same
code, :data:`CASES`) on the emulators and compares: losses, final weights and learning curves
to 1e-5, as the one-process parity tests (``tests/pipeline/test_mesh.py``,
``tests/asyncdp/test_mesh.py``). Then two experiments run end to end under the launcher and must
write one run folder whose rows equal a one-process ``--executor emulate`` run's.

Slow (``make test-slow``): each test starts a process group (JAX start-up, and compiling in
both processes at once on a shared CPU: most of the time). The launched processes compile
without a persistent cache (an executable written by one process and read by another crashed
pytest; root ``conftest.py``).
"""

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from experiments.runs.groups import TIMING_FIELDS

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TOL = 1e-5
LAUNCH = [PY, "-m", "jaxstale.launch", "--processes", "2", "--devices-per-process", "4"]
LAUNCH += ["--timeout", "120"]

pytestmark = pytest.mark.slow

# The cases, run by the launched program on "mesh" and by this test on "emulate". Every
# process of the group builds the same models and data from the same seeds.
CASES = """
import jax
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from jaxstale import asyncdp, delays, localsgd, loop, models, pipeline, schedules
from jaxstale.localsgd import mesh as localsgd_mesh
from jaxstale.mesh import make_mesh
from jaxstale.transforms.outer import outer_nesterov

K, B = 8, 4
POLICIES = ("vanilla", "stash", "nesterov")
ASYNC = [  # (method, delay model, M)
    ("asgd", "round_robin", 4),
    ("asgd", "gamma", 8),
    ("dc-asgd-a", "gamma", 4),
    ("dc-asgd-a", "round_robin", 8),
    ("ssgd", "round_robin", 8),
]


def _data(rng, n):
    x = rng.normal(size=(n, B, 4, 4, 1)).astype(np.float32)
    return x, rng.integers(0, 5, (n, B)).astype(np.int32)


def _out(res):
    flat = np.asarray(ravel_pytree(res.params)[0], np.float64)
    return {
        "losses": np.asarray(res.losses, np.float64).tolist(),
        "params": flat.tolist(),
        "checksum": float(np.abs(flat).sum()),
        "curve": res.curve,
        "diverged": res.diverged,
    }


def spans(mesh):
    return sorted({d.process_index for d in mesh.devices.flat})


def run_cases(executor):
    out = {}
    rng = np.random.default_rng(0)
    model = models.create("mlp", input_shape=(4, 4, 1), num_classes=5, hidden=(12, 20, 8))
    stages = models.functional_stages(model, 4)
    xb, yb = _data(rng, K)
    tx = optax.sgd(0.1, momentum=0.9)
    mesh = make_mesh(4, "stage") if executor == "mesh" else None
    if mesh is not None:
        assert spans(mesh) == list(range(jax.process_count())), spans(mesh)
    for policy in POLICIES:
        sched = schedules.one_f_one_b(4, K)
        ex = pipeline.make(
            executor, stages, sched, policy, tx, xb, yb, momentum=0.9, mesh=mesh
        )
        init = ([s.params for s in stages], [s.state for s in stages])
        (res,) = loop.run(ex, *init, eval_every=3, eval_data=(xb[0], yb[0]))
        out[f"pipeline/{policy}"] = _out(res)
    f = models.functional(models.create("mlp", input_shape=(4, 4, 1), num_classes=5, hidden=(12,)))
    T = 24
    x, y = _data(rng, T)
    for method, kind, m in ASYNC:
        if kind == "round_robin":
            sched = delays.round_robin(m, T)
        else:
            sched = delays.gamma_timed(m, T, batch_size=B, seed=1)
        if executor == "mesh":
            assert spans(asyncdp.default_data_mesh(m)) == list(range(jax.process_count()))
        res = asyncdp.run(
            f.apply, method, f.params, f.state, sched, x, y, executor=executor,
            learning_rate=0.1, momentum=0.9, warmup_steps=5, x_test=x[0], y_test=y[0],
            eval_every=10,
        )
        out[f"async/{method}/{kind}/M={m}"] = _out(res)
    for kind in ("synchronous", "streaming", "asynchronous"):  # DiLoCo, Streaming, DyLU
        stream = {}
        if kind == "synchronous":
            sched = localsgd.synchronous(4, 3, 3)
        elif kind == "streaming":  # two fragments, overlap 1, merge 0.5
            sched = localsgd.synchronous(4, 2, 4)
            stream = {"fragments": 2, "overlap": 1, "alpha": 0.5}
        else:
            sched = localsgd.asynchronous(
                8, 12, 3, seed=1, straggler_fraction=0.25, straggler_slowdown=2.0, dynamic=True
            )
        xs, ys = _data(np.random.default_rng(1), sched.num_batches)
        inner, outer = optax.adam(0.01), outer_nesterov(0.7, 0.9)
        if executor == "mesh":
            m = sched.num_workers
            ex = localsgd_mesh.executor(
                f.apply, inner, outer, sched, xs, ys, mesh=make_mesh(m, "data"), **stream
            )
        else:
            ex = localsgd.executor(f.apply, inner, outer, sched, xs, ys, **stream)
        (res,) = loop.run(ex, f.params, f.state, eval_every=2, eval_data=(x[0], y[0]))
        out[f"localsgd/{kind}"] = _out(res)
    return out
"""

TARGET = """
import json
import sys

import jax

from jaxstale import distributed

assert distributed.initialize()  # (already done by the launcher's bootstrap: idempotent)
assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (2, 4, 8)
out = run_cases("mesh")
if distributed.is_main_process():
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
print(f"DONE {jax.process_index()} {len(out)}", flush=True)
"""


def _launch(args, timeout=240):
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # no persistent cache shared across processes
    t0 = time.monotonic()
    r = subprocess.run(
        [*LAUNCH, "--", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    print(f"launched {args[:1]}: {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    return r


def _cases():
    namespace: dict = {}
    exec(compile(textwrap.dedent(CASES), "<cases>", "exec"), namespace)
    return namespace


def test_both_mesh_executors_across_two_processes_match_the_emulators(tmp_path):
    script = tmp_path / "target.py"
    script.write_text(textwrap.dedent(CASES) + textwrap.dedent(TARGET))
    out_file = tmp_path / "mesh.json"
    r = _launch([str(script), str(out_file)])
    assert "[p0] DONE 0 11" in r.stdout and "[p1] DONE 1 11" in r.stdout, r.stdout
    got = json.loads(out_file.read_text())
    want = _cases()["run_cases"]("emulate")
    assert got.keys() == want.keys()
    for name, w in want.items():
        g, w_ = got[name], json.loads(json.dumps(w))  # the same JSON round trip
        assert w_["losses"][0] != w_["losses"][-1], name  # it trained
        np.testing.assert_allclose(g["losses"], w_["losses"], atol=TOL, err_msg=name)
        np.testing.assert_allclose(g["params"], w_["params"], atol=TOL, err_msg=name)
        diff = np.max(np.abs(np.subtract(g["params"], w_["params"])))
        print(f"{name}: max|params diff| = {diff:.3g}")
        assert abs(g["checksum"] - w_["checksum"]) < 1e-3, name
        assert [c["step"] for c in g["curve"]] == [c["step"] for c in w_["curve"]], name
        for a, b in zip(g["curve"], w_["curve"], strict=True):
            assert abs(a["train_loss"] - b["train_loss"]) < TOL, name
            assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=TOL), name
        assert g["diverged"] == w_["diverged"] is False, name


# A run folder in a group: process 0 writes, process 1 writes nothing (its writes would fail
# here), both get the same rows and skip the same cells on a resume; folders that differ
# between the processes stop both with an error.
FOLDER = """
import json, os, pathlib, sys
import jax
from jaxstale.distributed import allgather_bytes, is_main_process
from experiments.runs import RunFolder, RunFolderError, atomic_write_text, markdown_table

out = pathlib.Path(sys.argv[1])


def refuse(write):  # process 1 must not write under out
    def guarded(path, *args, **kwargs):
        assert not str(path).startswith(str(out)), f"process 1 writes {path}"
        return write(path, *args, **kwargs)
    return guarded


if not is_main_process():
    os.replace, os.open = refuse(os.replace), refuse(os.open)
    pathlib.Path.mkdir = refuse(pathlib.Path.mkdir)


def same(value):  # the same value on every process
    data = json.dumps(value, sort_keys=True).encode().ljust(4096)
    assert len(set(allgather_bytes(data))) == 1, value


computed = []


def cells(keys):
    computed.extend(k["seed"] for k in keys)
    return [({"value": k["seed"] / 3, "lr": k["lr"]}, [{"step": 1, "loss": 0.5}]) for k in keys]


keys = [{"lr": 0.1, "seed": s} for s in range(3)]
run = RunFolder("toy", {"n": 3}, out=out / "run")
rows = run.run_grouped(keys, cells)
run.report(markdown_table(["seed"], [[0]]), {})
atomic_write_text(run.path / "extra.json", "{}")
same([rows, run.metrics(keys[1]), computed])
# resume with one more cell: every process skips the same three
again = RunFolder("toy", {"n": 3}, out=out / "run")
rows = again.run_grouped([*keys, {"lr": 0.1, "seed": 3}], cells)
same([rows, computed])
# seed 3 joins the group of lr 0.1: the resume recomputes that group whole (the lanes a fresh
# run gives it), records only seed 3 and checks the three finished cells against their files
assert computed == [0, 1, 2, 0, 1, 2, 3], computed
# the processes find different folders: all stop
if is_main_process():
    (out / "p0").mkdir()
    atomic_write_text(out / "p0" / "config.json", "{}")
try:
    RunFolder("toy", {"n": 3}, out=out / f"p{jax.process_index()}")
    raise SystemExit("no error")
except RunFolderError as e:
    assert "different files" in str(e), e
print(f"FOLDER OK {jax.process_index()}", flush=True)
"""


def test_run_folder_written_once_and_resumed_alike(tmp_path):
    script = tmp_path / "folder.py"
    script.write_text(textwrap.dedent(FOLDER))
    r = _launch([str(script), str(tmp_path / "out")], timeout=120)
    assert "[p0] FOLDER OK 0" in r.stdout and "[p1] FOLDER OK 1" in r.stdout, r.stdout
    run = tmp_path / "out" / "run"
    files = {"cells", "config.json", "extra.json", "metrics.jsonl", "summary.json", "table.md"}
    assert {p.name for p in run.iterdir()} == files  # no temporary files left either
    rows = json.loads((run / "summary.json").read_text())["rows"]
    assert [r["seed"] for r in rows] == [0, 1, 2]  # written by the first report
    assert len(list((run / "cells").iterdir())) == 4


# --- experiments end to end ------------------------------------------------------------------


def _same_rows(got: list[dict], want: list[dict]) -> None:
    """Rows equal field by field, floats to 1e-5; wall and CPU times left out."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            if k.startswith("wall") or k in TIMING_FIELDS:
                continue
            if isinstance(w[k], float):
                assert g[k] == pytest.approx(w[k], abs=TOL), (k, g, w)
            else:
                assert g[k] == w[k], (k, g, w)


def _end_to_end(tmp_path, name: str, flags: list[str]):
    """``name`` under the launcher with ``--executor mesh`` against ``--executor emulate`` in
    this process."""
    out = tmp_path / "launched"
    r = _launch([name, "--executor", "mesh", *flags, "--out", str(out / "run")])
    # exactly one run folder, complete, nothing half-written, written by process 0 alone
    assert [p.name for p in out.iterdir()] == ["run"]
    assert (out / "run" / "summary.json").is_file() and (out / "run" / "config.json").is_file()
    assert not [p for p in (out / "run").rglob(".*")], "temporary files left behind"
    assert "[p1] Traceback" not in r.stdout + r.stderr
    assert f"[p1] [{name}] summary:" not in r.stdout  # process 1 does not report files
    got = json.loads((out / "run" / "summary.json").read_text())["rows"]
    t0 = time.monotonic()
    importlib.import_module(f"experiments.{name}").main(
        [*flags, "--executor", "emulate", "--out", str(tmp_path / "emulated")]
    )
    print(f"{name} emulated in this process: {time.monotonic() - t0:.1f} s")
    want = json.loads((tmp_path / "emulated" / "summary.json").read_text())["rows"]
    assert got and len(got) == len(want)
    _same_rows(got, want)


def test_pipeline_staleness_under_the_launcher(tmp_path):
    flags = ["--model", "mlp", "--stages", "2,4", "--seeds", "1", "--steps", "20"]
    flags += ["--methods", "vanilla,stash", "--extend-edges", "0"]
    _end_to_end(tmp_path, "pipeline_staleness", flags)


def test_async_workers_under_the_launcher(tmp_path):
    flags = ["--workers", "1,4", "--seeds", "1", "--steps", "40", "--lrs", "0.01,0.03"]
    flags += ["--methods", "asgd,ssgd", "--extend-edges", "0"]
    _end_to_end(tmp_path, "async_workers", flags)


def test_pipeline_staleness_on_a_language_model_under_the_launcher(tmp_path):
    """Issue 23: a GPT's stages on two processes' devices (optax's elementwise Adam: the mesh
    executor updates flat weight vectors), the same losses as the emulator in one process."""
    flags = ["--dataset", "shakespeare", "--model", "gpt-tiny", "--optimizer", "adam"]
    flags += ["--stages", "2", "--seeds", "1", "--steps", "12", "--lrs", "0.003"]
    flags += ["--methods", "vanilla,stash", "--extend-edges", "0", "--eval-every", "6"]
    _end_to_end(tmp_path, "pipeline_staleness", flags)
