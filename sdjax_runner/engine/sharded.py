"""JAX's recommended data parallelism: one ``jax.jit`` over a ``Mesh(devices, ("data",))``. Params are
replicated with ``NamedSharding(mesh, P())`` (no device axis, each device's copy sent from host memory),
the batch is sharded along ``data``, and a ``jax.shard_map`` runs the generation program (:mod:`.program`) on each
device's slice: its latents drawn from its own key with the per-device shape, exactly as under pmap,
and classifier-free guidance's concatenate/split of the batch kept on the device. (Under a global
``jit`` view XLA moved half of every device's batch to another device at each step -- the
all-to-all and collective-permute that ``performance.profile=true`` showed -- and bf16 rounded
differently from pmap.) Global arrays are built shard by shard, so the same code runs across hosts."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdjax_runner.engine.generate import Generator


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


class ShardedGenerator(Generator):
    """One jit over a ``data`` mesh; works unchanged across processes (multi-host)."""

    def __init__(self, *args: Any, **kwargs: Any):
        import jax

        self.mesh = jax.sharding.Mesh(np.array(args[-1]), ("data",))
        self.data = jax.NamedSharding(self.mesh, jax.P("data"))
        self.replicated = jax.NamedSharding(self.mesh, jax.P())
        super().__init__(*args, **kwargs)
        self.guidance = global_array(np.float32(self.plan.guidance_scale), self.replicated)

    place_params = staticmethod(replicate_sharded)

    def program_args(self) -> tuple:
        return self._args(*self.inputs(0))

    def place_ids(self, ids: np.ndarray):
        return global_array(ids, self.data)

    def place_keys(self, keys: np.ndarray):
        return global_array(keys, self.data)

    def place_number(self, value: np.generic):
        return global_array(value, self.replicated)

    def _args(self, ids, keys, inputs) -> tuple:
        args = (ids, self.params, keys, self.guidance, inputs)
        return args + (self.negative_ids,) if self.negative_ids is not None else args

    def lower(self):
        import jax

        from sdjax_runner.engine.program import generate

        pipeline, spec = self.pipeline, self.spec

        def per_device(ids, params, keys, guidance, inputs, negative_ids=None):
            # One device's share, as under pmap: its latents drawn from its own key, (per_device_batch, C, h, w).
            return generate(pipeline, spec, ids, params, keys[0], guidance, inputs, negative_ids)

        args = self.program_args()
        data, replicated = jax.P("data"), jax.P()
        inputs = {name: replicated if name in self.numbers else data for name in args[4]}
        partitions = (data, replicated, data, replicated, inputs) + ((data,) if self.negative_ids is not None else ())
        # shard_map: each device runs the program on its own slice, so classifier-free guidance's
        # concatenate/split of the batch stays on the device (a global jit view would move halves
        # of the batch between devices at every step).
        mapped = jax.shard_map(per_device, mesh=self.mesh, in_specs=partitions, out_specs=data, check_vma=False)
        shardings = jax.tree_util.tree_map(lambda partition: jax.NamedSharding(self.mesh, partition), partitions,
                                           is_leaf=lambda node: isinstance(node, jax.P))
        function = jax.jit(mapped, in_shardings=shardings, out_shardings=self.data)
        return function.lower(*args)

    def run(self, ids, keys, inputs):
        assert self.compiled is not None  # installed by engine/engine.py
        return self.compiled(*self._args(ids, keys, inputs))

    def fetch(self, out) -> np.ndarray:
        import jax
        from jax.experimental import multihost_utils

        if jax.process_count() > 1:
            out = multihost_utils.process_allgather(out, tiled=True)
        return np.asarray(out)
