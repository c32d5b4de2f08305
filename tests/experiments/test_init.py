"""The experiments package asks XLA for deterministic GPU kernels, unless told otherwise."""

import os

import pytest

import experiments


def test_the_flag_is_added_once_and_a_users_choice_is_kept():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    experiments.deterministic_gpu_ops(env)
    want = "--xla_force_host_platform_device_count=8 --xla_gpu_deterministic_ops=true"
    assert env["XLA_FLAGS"] == want
    experiments.deterministic_gpu_ops(env)  # once
    assert env["XLA_FLAGS"] == want
    env = {}
    experiments.deterministic_gpu_ops(env)
    assert env == {"XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}
    env = {"XLA_FLAGS": "--xla_gpu_deterministic_ops=false"}  # the user's choice stands
    experiments.deterministic_gpu_ops(env)
    assert env == {"XLA_FLAGS": "--xla_gpu_deterministic_ops=false"}


def test_importing_the_experiments_set_it_for_this_process():
    assert "--xla_gpu_deterministic_ops=true" in os.environ["XLA_FLAGS"].split()


def test_a_gpu_started_before_the_import_keeps_its_flags_and_says_so():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    with pytest.warns(UserWarning, match="GPU backend started before"):
        experiments.deterministic_gpu_ops(env, gpu_running=lambda: True)
    # untouched: XLA read its flags already, and the fingerprint reads XLA_FLAGS
    assert env == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    env = {"XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}  # named: nothing to say
    experiments.deterministic_gpu_ops(env, gpu_running=lambda: True)
    assert env == {"XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}


def test_on_this_cpu_a_started_backend_is_not_a_gpu():
    import jax

    jax.numpy.zeros(1).block_until_ready()  # starts the backend
    assert not experiments._gpu_already_running()
