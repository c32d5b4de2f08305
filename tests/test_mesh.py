"""Mesh construction and checks (jaxstale.mesh), shared by both mesh executors."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from jaxstale.mesh import check_mesh, make_mesh


@pytest.mark.parametrize("n", [4, 8])
def test_make_mesh_from_cpu_devices(n):
    assert jax.device_count() >= 8  # conftest: 8 emulated CPU devices
    mesh = make_mesh(n, "stage")
    assert isinstance(mesh, Mesh)
    assert dict(mesh.shape) == {"stage": n}
    assert list(mesh.devices.flat) == jax.devices()[:n]
    assert check_mesh(mesh, "stage", n) is mesh
    assert dict(make_mesh(axis="data").shape) == {"data": jax.device_count()}


def test_make_mesh_rejects_bad_sizes():
    with pytest.raises(ValueError, match="only 8 are available"):
        make_mesh(9)
    with pytest.raises(ValueError, match="positive int"):
        make_mesh(0)


def test_check_mesh_errors():
    with pytest.raises(TypeError, match=r"jax\.sharding\.Mesh"):
        check_mesh(jax.devices(), "stage", 4)
    with pytest.raises(ValueError, match="axis named 'stage'"):
        check_mesh(make_mesh(4, "data"), "stage", 4)
    with pytest.raises(ValueError, match="has 8 devices but 4 are needed"):
        check_mesh(make_mesh(8, "stage"), "stage", 4)
    # extra axes are fine (replicated over)
    mesh2 = jax.make_mesh((4, 2), ("stage", "data"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    assert check_mesh(mesh2, "stage", 4) is mesh2


def test_to_host_reads_sharded_arrays():
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxstale.mesh import to_host

    mesh = make_mesh(4, "stage")
    x = jax.device_put(np.arange(8.0).reshape(4, 2), NamedSharding(mesh, PartitionSpec("stage")))
    np.testing.assert_array_equal(to_host(x), np.arange(8.0).reshape(4, 2))


def test_to_mesh_is_device_put_in_one_process():
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxstale.mesh import fetch_global, to_mesh

    mesh = make_mesh(4, "data")
    data, rep = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    x = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    tree = to_mesh({"a": x, "b": np.int32(3)}, {"a": data, "b": rep})
    assert tree["a"].sharding == data and tree["b"].sharding == rep
    np.testing.assert_array_equal(np.asarray(tree["a"]), x)
    one = to_mesh((x, x), data)
    assert all(a.sharding == data for a in one)
    assert fetch_global(tree) is not tree and fetch_global(tree)["a"] is tree["a"]


def test_make_mesh_takes_devices_from_every_process():
    """With several processes, a mesh smaller than the device list holds devices of each."""
    from types import SimpleNamespace

    from jaxstale.mesh import _every_process

    devs = [SimpleNamespace(id=i, process_index=i // 4) for i in range(8)]  # 2 x 4
    assert [d.id for d in _every_process(devs, 4, "data")] == [0, 1, 4, 5]
    assert [d.id for d in _every_process(devs, 3, "data")] == [0, 1, 4]
    assert [d.id for d in _every_process(devs, 2, "data")] == [0, 4]
    uneven = [*devs[:2], *devs[4:]]  # process 0 has 2 devices, process 1 has 4
    assert [d.id for d in _every_process(uneven, 5, "data")] == [0, 1, 4, 5, 6]
    with pytest.raises(ValueError, match="each of the 2 processes"):
        _every_process(devs, 1, "stage")
    one = [SimpleNamespace(id=i, process_index=0) for i in range(8)]
    assert _every_process(one, 3, "data") is one  # one process: the first devices
