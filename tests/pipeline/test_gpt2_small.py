"""GPT-2 small on the pipeline mesh executor (issue 54): 12 blocks unevenly over 8 emulated
devices (PipeDream's asynchronous 1F1B, SGD, the backward recomputing its forward), trained from
a token folder on disk, SIGKILL'd after a checkpoint and resumed — ending bit for bit where the
uninterrupted run ends. Each run is its own process (~10 GiB peak each: the mesh pads every
stage's flat weights to the largest stage's, the embedding block's 46 M, on all 8 devices;
AdamW's two more copies and saved residuals do not fit 24 GiB — issue 54's memory floor).
Slow: 163 M parameters on 2 CPU cores, ~3 minutes."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

UPDATES, BATCH = 4, 2


def _run(folder: str, out: str, ck: str | None, kill: bool) -> None:
    """One run; writes its losses and a digest of its final weights to ``out`` (``.npz``)."""
    import jax
    import optax

    from jaxstale import checkpoint, data, loop, models, pipeline, schedules

    ds = data.load("tokens", data_dir=folder)
    stages = models.functional_stages(
        models.create("gpt2-small", input_shape=(64,), num_classes=ds.num_classes), 8
    )
    idx = data.batch_indices(len(ds.x_train), batch_size=BATCH, num_steps=UPDATES, seed=0)
    xb, yb = data.indexed(ds.x_train, idx), data.indexed(ds.y_train, idx)
    ex = pipeline.make("mesh", stages, schedules.one_f_one_b(8, UPDATES), "vanilla",
                       optax.sgd(0.05), xb.gathered(), yb.gathered(),
                       backward="recompute")  # fmt: skip
    assert len(jax.devices()) >= 8

    def die(rounds, records):
        if kill:  # right after the first checkpoint: no handler runs, nothing is cleaned up
            os.kill(os.getpid(), signal.SIGKILL)

    saving = checkpoint.Checkpoints(ck, 1) if ck else None
    (res,) = loop.run(ex, [s.params for s in stages], [s.state for s in stages], eval_every=2,
                      callback=die, checkpoint=saving)  # fmt: skip
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(res.params):
        h.update(np.ascontiguousarray(leaf).tobytes())
    np.savez(out, losses=res.losses, digest=np.frombuffer(h.digest(), np.uint8))


def _child(*args: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, __file__, *args], env=env).returncode


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")  # pragma: no cover - not Linux


@pytest.mark.slow  # alone in its own `make test-slow` set (Makefile)
def test_gpt2_small_trains_on_8_devices_from_disk_and_resumes_bit_for_bit(tmp_path):
    from jaxstale import checkpoint, tokens

    if _available_gib() < 14:
        pytest.skip(f"needs ~11 GiB a child process; {_available_gib():.1f} GiB available")

    folder = str(tokens.write_text(tmp_path / "tokens"))
    ck = str(tmp_path / "ck")
    assert _child(folder, str(tmp_path / "whole.npz"), "", "") == 0
    assert _child(folder, str(tmp_path / "killed.npz"), ck, "kill") == -signal.SIGKILL
    # the first interval that completes an update (1F1B fills the pipeline first): round 6
    assert checkpoint.latest(ck) == 6 and not (tmp_path / "killed.npz").exists()
    assert _child(folder, str(tmp_path / "resumed.npz"), ck, "") == 0
    whole, resumed = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "resumed.npz")
    assert np.isfinite(whole["losses"]).all() and whole["losses"][-1] < whole["losses"][0]
    np.testing.assert_array_equal(resumed["losses"], whole["losses"])
    np.testing.assert_array_equal(resumed["digest"], whole["digest"])


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.path.insert(0, str(Path(__file__).parents[2]))
    _run(sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.argv[4] == "kill")
