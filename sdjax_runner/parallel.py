"""Put params and inputs on devices for the pmap path (replicate params, shard inputs)."""

from __future__ import annotations

import numpy as np


def replicate_from_host(tree, devices):
    """Give every device its own copy of each host array, with a leading device axis.

    The result is what ``flax.jax_utils.replicate`` returns (a global array of
    shape ``(len(devices), ...)`` sharded over the devices), but each device's
    copy is transferred straight from host memory: nothing is stacked on one
    device, nor N times over on the host.
    """
    import jax

    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
    sharding = jax.NamedSharding(mesh, jax.P("devices"))

    def put(leaf):
        host = np.asarray(leaf)[None]
        shards = [jax.device_put(host, device) for device in devices]
        return jax.make_array_from_single_device_arrays((len(devices),) + host.shape[1:], sharding, shards)

    return jax.tree_util.tree_map(put, tree)


def global_array(host, sharding):
    """A global array from a host value every process holds in full: each process transfers
    only its own devices' shards, straight from host memory (works across hosts)."""
    import jax

    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def replicate_sharded(tree, devices):
    """Every leaf replicated over ``Mesh(devices, ("data",))`` with ``NamedSharding(mesh, P())``:
    the array keeps its own shape (no device axis), one copy per device, sent from host memory."""
    import jax

    sharding = jax.NamedSharding(jax.sharding.Mesh(np.array(devices), ("data",)), jax.P())
    return jax.tree_util.tree_map(lambda leaf: global_array(leaf, sharding), tree)


PLACEMENTS = {"pmap": replicate_from_host, "sharded": replicate_sharded}


def shard(array: np.ndarray, num_devices: int) -> np.ndarray:
    """(num_devices * b, ...) -> (num_devices, b, ...), as flax's shard does for all devices."""
    return array.reshape((num_devices, -1) + array.shape[1:])


def param_bytes_per_device(tree) -> int:
    import jax

    return int(sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(tree)))
