"""The gpt-cpu step against PyTorch (issue 54): without torch the script says so in one line;
with it, the PyTorch model is the library's GPT — from the library's weights (and the exact
GELU, PyTorch's) both sides give the same loss and the same gradients."""

import sys

import jax
import numpy as np
import pytest

from benchmarks import lm_step_torch as bench
from jaxstale import losses, models


def test_without_torch_one_line_and_nothing_run(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert bench.main(["--quick"]) == {}
    assert (
        capsys.readouterr().out.strip() == "lm_step_torch: needs torch (pip install torch); not run"
    )


def test_the_pytorch_model_is_the_library_gpt():
    torch = pytest.importorskip("torch")
    model = models.create("gpt-cpu", input_shape=(64,), num_classes=83, seed=0)
    fn = models.functional(model)
    phases, n, tmodel = bench.torch_phases(4, False, fn.params)
    assert n == models.param_count(model) == 414_803
    x, y = (np.asarray(a[:4], np.int32) for a in bench._batch(4))

    def loss(p):
        return losses.cross_entropy(fn.apply(p, fn.state, x, True)[0], y)

    with bench.variant("erf"):  # PyTorch's nn.GELU is the exact one
        value, grads = jax.jit(jax.value_and_grad(loss))(fn.params)
    assert phases["grad"]() == pytest.approx(float(value), rel=1e-5)
    want = bench.torch_weights(grads)
    got = {k: p.grad.numpy() for k, p in tmodel.named_parameters()}
    assert set(got) == set(want)
    for k in got:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-3, atol=2e-5, err_msg=k)
    with bench.variant("jaxstale"):  # the library's tanh GELU is another function
        other = float(jax.jit(loss)(fn.params))
    assert other != pytest.approx(float(value), rel=1e-7) and torch.get_num_threads() >= 1
