"""Bad input to the RL corrections (issue 51's second pass): one clear line each, starting
with the function's name and naming the argument; the boundaries that are allowed pass."""

import math
import re

import jax.numpy as jnp
import pytest

from jaxstale import rl

LP = jnp.log(jnp.array([[0.5, 0.2], [0.3, 0.3]]))
BP = jnp.log(jnp.array([[0.25, 0.25], [0.25, 0.25]]))
ADV = jnp.array([1.0, -1.0])
V = ValueError

ROWS = [
    ("ppo_clip", "eps_low", lambda: rl.ppo_clip(LP, BP, ADV, eps_low=-0.2)),
    ("ppo_clip", "eps_low", lambda: rl.ppo_clip(LP, BP, ADV, eps_low=1.5)),
    ("ppo_clip", "eps_high", lambda: rl.ppo_clip(LP, BP, ADV, eps_high=math.nan)),
    ("tis", "cap", lambda: rl.tis(LP, BP, ADV, cap=0.0)),
    ("tis", "cap", lambda: rl.tis(LP, BP, ADV, cap=-1.0, level="sequence")),
    ("icepop", "low", lambda: rl.icepop(LP, BP, ADV, low=2.0, high=0.5)),
    ("icepop", "low", lambda: rl.icepop(LP, BP, ADV, low=-1.0)),
    ("mis", "low", lambda: rl.mis(LP, BP, ADV, low=3.0, high=2.0)),
    ("mis", "cap", lambda: rl.mis(LP, BP, ADV, cap=0.0)),
    ("m2po", "threshold", lambda: rl.m2po(LP, BP, ADV, threshold=-0.04)),
    ("m2po", "threshold", lambda: rl.m2po_mask(LP, BP, threshold=0.0)),
    ("decoupled_ppo", "eps", lambda: rl.decoupled_ppo(LP, BP, BP, ADV, eps=math.nan)),
    ("decoupled_ppo", "cap", lambda: rl.decoupled_ppo(LP, BP, BP, ADV, cap=0.0)),
    ("decoupled_ppo", "proximal", lambda: rl.decoupled_ppo(LP, BP[:1], BP, ADV)),
    ("vcpo", "cap", lambda: rl.vcpo(LP, BP, ADV, cap=-8.0)),
    ("reinforce", "advantages", lambda: rl.reinforce(LP, BP, jnp.ones(3))),
    ("ppo_clip", "advantages", lambda: rl.ppo_clip(LP, BP, jnp.ones((2, 3)))),
    ("tis", "mask", lambda: rl.tis(LP, BP, ADV, jnp.ones(2))),
    ("vcpo", "log-probabilities", lambda: rl.vcpo(LP[0], BP[0], ADV[:1])),
    ("ess_ratio", "behaviour", lambda: rl.ess_ratio(LP, BP[:, :1])),
    ("ess_ratio", "behaviour", lambda: rl.ess_ratio(LP, None)),
]


@pytest.mark.parametrize(("where", "argument", "call"), ROWS, ids=[f"{w} {a}" for w, a, _ in ROWS])
def test_bad_input_is_one_line_naming_the_function_and_the_argument(where, argument, call):
    with pytest.raises(V) as info:
        call()
    message = str(info.value)
    assert "\n" not in message.strip() and message.startswith(f"{where}:"), message
    assert re.search(rf"\b{re.escape(argument)}\b", message), message


def test_the_allowed_boundaries_pass():
    rl.tis(LP, BP, ADV, cap=math.inf)  # untruncated importance sampling
    rl.ppo_clip(LP, BP, ADV, eps_low=0.0, eps_high=0.0)
    rl.ppo_clip(LP, BP, jnp.ones_like(LP))  # one advantage per id
    rl.icepop(LP, BP, ADV, low=0.0, high=1.0)
    rl.decoupled_ppo(LP, BP, BP, ADV, cap=None)
    assert float(rl.ess_ratio(LP, LP)) == 1.0
