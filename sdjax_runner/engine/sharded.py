"""JAX's recommended data parallelism: one ``jax.jit`` over a ``Mesh(devices, ("data",))``. Params are
replicated with ``NamedSharding(mesh, P())`` (no device axis, each device's copy sent from host memory),
the batch is sharded along ``data``, and a ``jax.shard_map`` runs the generation program (:mod:`.program`) on each
device's slice: its latents drawn from its own key with the per-device shape, exactly as under pmap,
and classifier-free guidance's concatenate/split of the batch kept on the device. (Under a global
``jit`` view XLA moved half of every device's batch to another device at each step -- the
all-to-all and collective-permute that ``performance.profile=true`` showed -- and bf16 rounded
differently from pmap.) Global arrays are built shard by shard, so the same code runs across hosts.

``parallelism.params=sharded`` splits the weights instead (FSDP-style): every weight of at least
:data:`MIN_SPLIT` elements is placed with ``NamedSharding(mesh, P(..., "data", ...))`` along its largest axis the
device count divides (the rest stay replicated), so each device holds about 1/N of them. Inside the program a
device gathers them (``all_gather`` over ``data``) where they are used: a family that can do so block by block says
which weights it gathers itself (FLUX.1's transformer blocks, families/flux/engine/family.py: one block's weights whole at a
time); everything else is gathered per component as the program starts. The per-device program is otherwise the
replicated one: the same numbers, the same images."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdjax_runner.engine.families import FAMILIES
from sdjax_runner.engine.generate import Generator
from sdjax_runner.engine.split import gather_tree, spec_of, split_spec


def global_array(host, sharding):
    """A global array from a host value every process holds in full: each process transfers
    only its own devices' shards, straight from host memory (works across hosts)."""
    import jax

    host = np.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def split_sharded(tree, devices):
    """Every leaf placed over ``Mesh(devices, ("data",))`` by :func:`split_spec`, from host memory shard by shard."""
    import jax

    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    return jax.tree_util.tree_map(
        lambda leaf: global_array(leaf, jax.NamedSharding(mesh, split_spec(np.shape(leaf), len(devices)))), tree)


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

    @classmethod
    def place_weights(cls, tree, devices: list, placement: str):
        return split_sharded(tree, devices) if placement == "sharded" else replicate_sharded(tree, devices)

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
        args = self.program_args()
        weights = jax.tree_util.tree_map(spec_of, args[1])  # each weight's placement: replicated, or split
        if spec.params == "sharded":
            pipeline, gathers_itself = FAMILIES[spec.family].split_weights(pipeline, weights)
        else:
            gathers_itself = None

        def per_device(ids, params, keys, guidance, inputs, negative_ids=None):
            if gathers_itself is not None:  # split weights: whole per component, but those the family gathers itself
                params = {component: {key: value if gathers_itself(component, key) else
                                      gather_tree(value, weights[component][key]) for key, value in tree.items()}
                          if isinstance(tree, dict) else gather_tree(tree, weights[component])
                          for component, tree in params.items()}
            # One device's share, as under pmap: its latents drawn from its own key, (per_device_batch, C, h, w).
            return generate(pipeline, spec, ids, params, keys[0], guidance, inputs, negative_ids)

        data, replicated = jax.P("data"), jax.P()
        inputs = {name: replicated if name in self.numbers else data for name in args[4]}
        partitions = (data, weights, data, replicated, inputs) + ((data,) if self.negative_ids is not None else ())
        # shard_map: each device runs the program on its own slice, so classifier-free guidance's
        # concatenate/split of the batch stays on the device (a global jit view would move halves
        # of the batch between devices at every step).
        mapped = jax.shard_map(per_device, mesh=self.mesh, in_specs=partitions, out_specs=data, check_vma=False)
        shardings = jax.tree_util.tree_map(lambda partition: jax.NamedSharding(self.mesh, partition), partitions,
                                           is_leaf=lambda node: isinstance(node, jax.P))
        function = jax.jit(mapped, in_shardings=shardings, out_shardings=self.data)
        return function.lower(*args)

    def lower_decoder(self):
        import jax

        from sdjax_runner.engine.program import decode

        pipeline, family, split = self.pipeline, self.spec.family, self.spec.params == "sharded"
        params, latents = self.decoder_args()
        weights = jax.tree_util.tree_map(spec_of, params)  # each weight's placement: replicated, or split

        def decoder(params, latents):  # (its name is the program's: a trace's hlo_module tells the two apart)
            if split:  # split weights: whole on each device as the program starts
                params = gather_tree(params, weights)
            return decode(pipeline, family, params, latents)

        data = jax.P("data")
        mapped = jax.shard_map(decoder, mesh=self.mesh, in_specs=(weights, data), out_specs=data, check_vma=False)
        shardings = (jax.tree_util.tree_map(lambda partition: jax.NamedSharding(self.mesh, partition), weights,
                                            is_leaf=lambda node: isinstance(node, jax.P)), self.data)
        return jax.jit(mapped, in_shardings=shardings, out_shardings=self.data).lower(params, latents)

    def run(self, ids, keys, inputs):
        assert self.compiled is not None  # installed by engine/engine.py
        return self.decoded(self.compiled(*self._args(ids, keys, inputs)))

    def gathered(self, out):
        import jax
        from jax.experimental import multihost_utils

        if jax.process_count() > 1:
            out = multihost_utils.process_allgather(out, tiled=True)
        return out
