"""Device mesh and the mapping of logical axis names onto it.

The model names every parameter and activation axis logically (batch, embed, heads, ...);
`MeshConfig.rules` maps those names to mesh axes `data`, `fsdp` and `model`. Changing the
parallelism layout is a config edit, not a model edit:

    data   pure data parallelism (batch split, parameters replicated)
    fsdp   batch split *and* parameters/optimizer state split along `embed` (ZeRO-3 style)
    model  tensor parallelism: heads, feed-forward and vocabulary split (Megatron style)

The mesh always has all three axes; a size-1 axis is free, so "optional fsdp" is `fsdp=1`.
"""
from __future__ import annotations

import contextlib
import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from pmi_jax.config import MeshConfig
from pmi_jax.errors import UserInputError

MESH_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")  # mesh axes the batch dimension is split over


def mesh_shape(mesh_config: MeshConfig, num_devices: int) -> tuple[int, int, int]:
    """Resolve the -1 axis and check that the shape uses every device exactly once."""
    sizes = [mesh_config.data, mesh_config.fsdp, mesh_config.model]
    described = ", ".join(f"{name}={size}" for name, size in zip(MESH_AXES, sizes))
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise UserInputError(f"mesh ({described}): sizes must be positive, with at most one -1 (= the rest)")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise UserInputError(f"mesh ({described}) does not match the {num_devices} devices: "
                                 f"{num_devices} is not divisible by {known}")
        sizes[sizes.index(-1)] = num_devices // known
    elif known != num_devices:
        raise UserInputError(f"mesh ({described}) has {known} positions but there are {num_devices} devices")
    return tuple(sizes)


def make_mesh(mesh_config: MeshConfig, devices=None) -> Mesh:
    """A (data, fsdp, model) mesh over all devices of all processes.

    `jax.make_mesh` orders devices so that the innermost axis (`model`) stays within a host
    and, on TPU, along the fast interconnect.
    """
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(mesh_config, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def batch_axis_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def rules(mesh_config: MeshConfig) -> tuple:
    """The logical axis rules as flax expects them: tuple of (name, mesh axes) pairs."""
    return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in mesh_config.rules)


@contextlib.contextmanager
def activate(mesh: Mesh, mesh_config: MeshConfig):
    """Make `nn.with_logical_constraint` in the model resolve against this mesh and rules.

    Must surround the first call of a jitted function: the constraints bind at trace time.
    """
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules(mesh_config)):
        yield


def logical_to_sharding(logical_specs, mesh: Mesh, mesh_config: MeshConfig):
    """A tree of logical PartitionSpecs -> a tree of NamedShardings on `mesh`."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, rules(mesh_config))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def host_batch_rows(mesh: Mesh, global_batch: int) -> tuple[int, int]:
    """The contiguous rows [start, stop) of the global batch that this process must feed.

    Each process supplies exactly the rows held by its own devices; with the model axis
    inside a host these form one contiguous block. Data sources read shard
    `start // (stop - start)` of `global_batch // (stop - start)`.
    """
    sharding = batch_sharding(mesh, ndim=1)
    index_map = sharding.addressable_devices_indices_map((global_batch,))
    rows = sorted({(s[0].start or 0, global_batch if s[0].stop is None else s[0].stop) for s in index_map.values()})
    start, stop = rows[0][0], rows[-1][1]
    covered = sum(b - a for a, b in rows)
    if covered != stop - start or any(b != c for (_, b), (c, _) in zip(rows, rows[1:])):
        raise UserInputError(
            f"this process's devices hold non-contiguous batch rows {rows}; choose a mesh whose "
            "data/fsdp axes are laid out across hosts")
    return start, stop


def global_batch_from_host(local_batch: dict, mesh: Mesh, global_batch: int) -> dict:
    """Assemble a global jax.Array batch from each host's local rows."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v), (global_batch, *v.shape[1:]))
            for k, v in local_batch.items()}


def check_divisible(abstract_params, param_shardings, logical_specs) -> None:
    """Raise a UserInputError naming the first parameter that the mesh cannot split evenly."""
    flat_shapes = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    flat_shardings = jax.tree.leaves(param_shardings)
    flat_specs = jax.tree.leaves(logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (path, leaf), sharding, names in zip(flat_shapes, flat_shardings, flat_specs):
        for dim, (size, axes, name) in enumerate(zip(leaf.shape, sharding.spec, names)):
            ways = math.prod(sharding.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
            if size % ways:
                where = "/".join(str(getattr(k, "key", k)) for k in path)
                raise UserInputError(
                    f"parameter {where} {tuple(leaf.shape)}: dimension {dim} ({name}, size {size}) cannot be split "
                    f"{ways} ways over mesh axes {axes}; change the mesh or map '{name}' to None in mesh.rules")
