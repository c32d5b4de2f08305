"""The experiments package asks XLA for deterministic GPU kernels, unless told otherwise."""

import os

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
