"""The guide's parallel mode: params replicated with a leading device axis, inputs sharded as
``(devices, batch, ...)``, and diffusers' own pmapped ``_p_generate`` (what ``pipeline(..., jit=True)``
calls), compiled ahead of time."""

from __future__ import annotations

import inspect
import sys
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
    return treedef.unflatten([
        jax.make_array_from_single_device_arrays((len(devices),) + host.shape[1:], sharding,
                                                 [on_device[i] for on_device in copies])
        for i, host in enumerate(hosts)])


def shard(array: np.ndarray, num_devices: int) -> np.ndarray:
    """(num_devices * b, ...) -> (num_devices, b, ...), as flax's shard does for all devices."""
    return array.reshape((num_devices, -1) + array.shape[1:])


class PmapGenerator(Generator):
    """The guide's ``pipeline(prompt_ids, params, rng, jit=True)``, compiled ahead of time."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        import jax.numpy as jnp

        # As pipeline.__call__ builds it from a float guidance scale: one per device, float32.
        self.guidance = jnp.array([self.plan.guidance_scale] * self.plan.num_devices)[:, None]

    place_params = staticmethod(replicate_from_host)

    def place_ids(self, ids: np.ndarray):
        return shard(ids, self.plan.num_devices)

    def place_keys(self, keys: np.ndarray):
        return keys

    def program_args(self) -> tuple:
        ids, keys = self.inputs(0)
        return ids, self.params, keys, self.guidance, self.negative_ids

    def lower(self):
        # The pipeline module's own pmapped _p_generate; SDXL's takes a trailing static return_latents.
        module = sys.modules[type(self.pipeline).__module__]
        extra = (False,) if len(inspect.signature(module._p_generate).parameters) > 10 else ()
        ids, keys = self.inputs(0)
        return module._p_generate.lower(self.pipeline, ids, self.params, keys, self.plan.num_inference_steps,
                                        self.height, self.width, self.guidance, None, self.negative_ids, *extra)

    def run(self, ids, keys):
        return self.compiled(ids, self.params, keys, self.guidance, None, self.negative_ids)
