"""The guide's parallel mode: params replicated with a leading device axis, inputs sharded as
``(devices, batch, ...)``, and the generation programs (:mod:`.program`) pmapped over the devices -- what
diffusers' ``pipeline(..., jit=True)`` does with its ``_p_generate``, the decoder a program of its own -- compiled
ahead of time."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdjax_runner.engine.generate import Generator


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
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    hosts = [np.asarray(leaf)[None] for leaf in leaves]
    copies = [jax.device_put(hosts, device) for device in devices]  # one batched transfer per device
    return jax.tree_util.tree_unflatten(treedef, [
        jax.make_array_from_single_device_arrays((len(devices),) + host.shape[1:], sharding,
                                                 [on_device[i] for on_device in copies])
        for i, host in enumerate(hosts)])


def shard(array: np.ndarray, num_devices: int) -> np.ndarray:
    """(num_devices * b, ...) -> (num_devices, b, ...), as flax's shard does for all devices."""
    return array.reshape((num_devices, -1) + array.shape[1:])


class PmapGenerator(Generator):
    """The guide's ``pipeline(prompt_ids, params, rng, jit=True)``, compiled ahead of time."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import jax.numpy as jnp

        # As pipeline.__call__ builds it from a float guidance scale: one per device, float32.
        self.guidance = jnp.array([self.plan.guidance_scale] * self.plan.num_devices)[:, None]

    place_params = staticmethod(replicate_from_host)

    def place_ids(self, ids: np.ndarray):
        return shard(ids, self.plan.num_devices)

    def place_keys(self, keys: np.ndarray):
        return keys

    def place_number(self, value: np.generic):
        import jax.numpy as jnp

        return jnp.asarray(np.repeat(value[None], self.plan.num_devices))  # one per device, as the guidance

    def program_args(self) -> tuple:
        ids, keys, inputs = self.inputs(0)
        return ids, self.params, keys, self.guidance, inputs, self.negative_ids

    def lower(self):
        import functools

        import jax

        from sdjax_runner.engine.program import generate

        return jax.pmap(functools.partial(generate, self.pipeline, self.spec)).lower(*self.program_args())

    def lower_decoder(self):
        import jax

        from sdjax_runner.engine.program import decode

        pipeline, family = self.pipeline, self.spec.family
        mapped = jax.pmap(lambda params, latents: decode(pipeline, family, params, latents))

        def decoder(params, latents):  # named: a pmap's program is "jit__fun" whatever it runs, the sampling
            return mapped(params, latents)  # program's too, and a profile tells their operations apart by name

        params, latents = self.decoder_args()
        sharding = self.latents_info().sharding  # where the sampling program leaves them
        return jax.jit(decoder).lower(params, jax.ShapeDtypeStruct(latents.shape, latents.dtype, sharding=sharding))

    def run(self, ids, keys, inputs):
        assert self.compiled is not None  # installed by engine/engine.py
        return self.decoded(self.compiled(ids, self.params, keys, self.guidance, inputs, self.negative_ids))
