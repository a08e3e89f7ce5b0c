"""pmi_jax/partitioning.py on the 8 virtual CPU devices of tests/conftest.py: mesh shapes, the
logical-axis rules, and which batch rows a process feeds."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from pmi_jax import partitioning
from pmi_jax.config import MeshConfig
from pmi_jax.errors import UserInputError


@pytest.fixture(scope="module")
def devices():
    if len(jax.devices()) < 8:
        pytest.skip("needs the 8 host-platform devices set up in tests/conftest.py")
    return jax.devices()[:8]


@pytest.mark.parametrize("config, devices_, shape", [
    (MeshConfig(), 8, (8, 1, 1)),
    (MeshConfig(data=-1, model=2), 8, (4, 1, 2)),
    (MeshConfig(data=2, fsdp=-1, model=2), 8, (2, 2, 2)),
    (MeshConfig(data=1, fsdp=1, model=1), 1, (1, 1, 1)),
    (MeshConfig(data=2, fsdp=2, model=2), 8, (2, 2, 2)),
])
def test_mesh_shape_resolves_the_rest_axis(config, devices_, shape):
    assert partitioning.mesh_shape(config, devices_) == shape


@pytest.mark.parametrize("config, devices_, message", [
    (MeshConfig(data=-1, model=3), 8, "8 is not divisible by 3"),
    (MeshConfig(data=2, fsdp=1, model=2), 8, "has 4 positions but there are 8 devices"),
    (MeshConfig(data=-1, fsdp=-1), 8, "at most one -1"),
    (MeshConfig(data=0), 8, "sizes must be positive"),
    (MeshConfig(data=-2), 8, "sizes must be positive"),
])
def test_mesh_shape_errors_describe_the_mesh(config, devices_, message):
    with pytest.raises(UserInputError, match=message) as error:
        partitioning.mesh_shape(config, devices_)
    assert f"data={config.data}, fsdp={config.fsdp}, model={config.model}" in str(error.value)


def test_make_mesh_has_the_three_named_axes(devices):
    mesh = partitioning.make_mesh(MeshConfig(data=-1, fsdp=2, model=2), devices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}
    assert partitioning.batch_axis_size(mesh) == 4
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_rules_map_logical_names_to_mesh_axes(devices):
    config = MeshConfig(data=-1, fsdp=2, model=2, rules=MeshConfig().rules + (("extra", ["data", "model"]),))
    rules = dict(partitioning.rules(config))
    assert rules["batch"] == ("data", "fsdp") and rules["vocab"] == "model" and rules["length"] is None
    assert rules["extra"] == ("data", "model")  # lists (from --set) become tuples, as flax expects
    mesh = partitioning.make_mesh(config, devices)
    shardings = partitioning.logical_to_sharding(
        {"embedding": PartitionSpec("vocab", "embed"), "bias": PartitionSpec("embed")}, mesh, config)
    assert shardings["embedding"].spec == PartitionSpec("model", "fsdp")
    assert shardings["bias"].spec == PartitionSpec("fsdp")


def test_a_sharded_array_is_split_as_the_rules_say(devices):
    config = MeshConfig(data=-1, fsdp=2, model=2)
    mesh = partitioning.make_mesh(config, devices)
    sharding = partitioning.logical_to_sharding(PartitionSpec("vocab", "embed"), mesh, config)
    x = jax.device_put(jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6), sharding)
    assert {s.data.shape for s in x.addressable_shards} == {(4, 3)}  # vocab over model=2, embed over fsdp=2
    np.testing.assert_array_equal(np.asarray(x), np.arange(48).reshape(8, 6))


def test_one_process_feeds_every_row_and_the_batch_is_assembled(devices):
    mesh = partitioning.make_mesh(MeshConfig(data=-1, model=2), devices)
    assert partitioning.host_batch_rows(mesh, 16) == (0, 16)
    local = {"inputs": np.arange(16 * 3, dtype=np.int32).reshape(16, 3)}
    batch = partitioning.global_batch_from_host(local, mesh, 16)
    assert batch["inputs"].shape == (16, 3)
    assert batch["inputs"].sharding.spec == PartitionSpec(("data", "fsdp"), None)
    assert {s.data.shape for s in batch["inputs"].addressable_shards} == {(4, 3)}  # 4 batch ways, model replicates
    np.testing.assert_array_equal(np.asarray(batch["inputs"]), local["inputs"])


def test_check_divisible_names_the_parameter(devices):
    config = MeshConfig(data=-1, model=4)
    mesh = partitioning.make_mesh(config, devices)
    specs = {"layer": {"kernel": PartitionSpec("embed", "mlp")}}
    shardings = partitioning.logical_to_sharding(specs, mesh, config)
    partitioning.check_divisible({"layer": {"kernel": jax.ShapeDtypeStruct((8, 12), jnp.float32)}}, shardings, specs)
    with pytest.raises(UserInputError, match=r"layer/kernel \(8, 10\): dimension 1 \(mlp, size 10\) cannot be "
                                             r"split 4 ways"):
        partitioning.check_divisible({"layer": {"kernel": jax.ShapeDtypeStruct((8, 10), jnp.float32)}},
                                     shardings, specs)
