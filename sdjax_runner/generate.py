"""Sharded batches -> images and timings.

Both paths run diffusers' own ``FlaxStableDiffusionPipeline._generate`` and give the same
images for the same plan:

* ``pmap`` -- the guide's path: diffusers' ``_p_generate`` (what ``pipeline(..., jit=True)``
  calls) over params with a leading device axis and inputs sharded as ``(devices, batch, ...)``.
* ``sharded`` -- one ``jax.jit`` over a ``Mesh(devices, ("data",))``: params replicated with
  ``NamedSharding(mesh, P())``, the batch sharded along ``data``. Each device's latents are
  drawn from its own key with the per-device shape, exactly as under pmap, and handed to
  ``_generate`` as ``latents``.

Programs are compiled ahead of time so compilation is timed apart from execution.
"""

from __future__ import annotations

import inspect
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np

from sdjax_runner.parallel import global_array, shard
from sdjax_runner.plan import Plan


def batch_keys(seed: int, batch: int, num_devices: int) -> np.ndarray:
    """Per-device PRNG keys: the guide's split(PRNGKey(seed)) for batch 0, fold_in(batch) after."""
    import jax

    key = jax.random.PRNGKey(seed)
    if batch:
        key = jax.random.fold_in(key, batch)
    return np.asarray(jax.random.split(key, num_devices))


@dataclass
class Timings:
    first_batch_s: float = 0.0  # the first execution in this job, blocked
    steady_s: list[float] = field(default_factory=list)  # later executions, each blocked

    def summary(self, images_per_batch: int, steps: int) -> dict[str, float]:
        median = statistics.median(self.steady_s)
        return {
            "first_batch_s": self.first_batch_s,
            "generate_s": median,
            "generate_s_min": min(self.steady_s),
            "generate_s_max": max(self.steady_s),
            "steady_state_samples": len(self.steady_s),
            "images_per_s": images_per_batch / median,
            "s_per_step": median / steps,
        }


def compile_key(plan: Plan, height: int, width: int) -> tuple:
    """What, besides the pipeline and devices, makes the compiled program differ."""
    return (plan.num_inference_steps, height, width, plan.per_device_batch_size, plan.negative is not None)


class Generator:
    """One job's batches through a compiled generate function; subclasses place the data."""

    def __init__(self, pipeline: Any, params: dict, safety_params: Any, plan: Plan, height: int, width: int,
                 devices: list):
        self.pipeline, self.params, self.safety_params = pipeline, params, safety_params
        self.plan, self.height, self.width, self.devices = plan, height, width, devices
        self.timings = Timings()
        self.compiled: Optional[Callable] = None
        self.negative_ids = None
        if plan.negative:
            self.negative_ids = self.place_ids(np.asarray(pipeline.prepare_inputs([plan.negative] * plan.images_per_batch)))

    def place_ids(self, ids: np.ndarray):
        raise NotImplementedError

    def place_keys(self, keys: np.ndarray):
        raise NotImplementedError

    def inputs(self, batch: int) -> tuple:
        """The batch's prompt ids and per-device keys, placed for this path."""
        ids = self.place_ids(np.asarray(self.pipeline.prepare_inputs(self.plan.batch_prompts(batch))))
        return ids, self.place_keys(batch_keys(self.plan.seed, batch, self.plan.num_devices))

    def lower(self):
        raise NotImplementedError

    def run(self, *inputs):
        """One batch, asynchronously."""
        raise NotImplementedError

    def fetch(self, out) -> np.ndarray:
        """The batch's images on the host, (images, H, W, 3) floats in [0, 1]."""
        return np.asarray(out).reshape((-1, self.height, self.width, 3))

    def _timed(self, inputs: tuple) -> tuple[Any, float]:
        started = time.perf_counter()
        out = self.run(*inputs).block_until_ready()
        return out, time.perf_counter() - started

    def generate(self, on_batch: Callable[[], Any] = lambda: None) -> Iterator[np.ndarray]:
        """Yield each batch's images (N, H, W, 3) as uint8, recording timings."""
        for batch in range(self.plan.num_batches):
            out, seconds = self._timed(self.inputs(batch))
            if batch == 0:
                self.timings.first_batch_s = seconds
            else:
                self.timings.steady_s.append(seconds)
            yield self._to_uint8(self.fetch(out))
            on_batch()
        first = self.inputs(0)
        while len(self.timings.steady_s) < self.plan.repeats:
            self.timings.steady_s.append(self._timed(first)[1])

    def _to_uint8(self, images: np.ndarray) -> np.ndarray:
        pixels = (images * 255).round().astype("uint8")  # as pipeline.numpy_to_pil does
        if getattr(self.pipeline, "safety_checker", None) is not None:  # SD 1.x/2.x only
            pixels, _ = self.pipeline._run_safety_checker(pixels, self.safety_params, jit=False)
        return pixels


class PmapGenerator(Generator):
    """The guide's ``pipeline(prompt_ids, params, rng, jit=True)``, compiled ahead of time."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        import jax.numpy as jnp

        # As pipeline.__call__ builds it from a float guidance scale: one per device, float32.
        self.guidance = jnp.array([self.plan.guidance_scale] * self.plan.num_devices)[:, None]

    def place_ids(self, ids: np.ndarray):
        return shard(ids, self.plan.num_devices)

    def place_keys(self, keys: np.ndarray):
        return keys

    def lower(self):
        # The pipeline module's own pmapped _p_generate; SDXL's takes a trailing static return_latents.
        module = sys.modules[type(self.pipeline).__module__]
        extra = (False,) if len(inspect.signature(module._p_generate).parameters) > 10 else ()
        ids, keys = self.inputs(0)
        return module._p_generate.lower(self.pipeline, ids, self.params, keys, self.plan.num_inference_steps,
                                        self.height, self.width, self.guidance, None, self.negative_ids, *extra)

    def run(self, ids, keys):
        return self.compiled(ids, self.params, keys, self.guidance, None, self.negative_ids)


class ShardedGenerator(Generator):
    """One jit over a ``data`` mesh; works unchanged across processes (multi-host)."""

    def __init__(self, *args: Any):
        import jax

        self.mesh = jax.sharding.Mesh(np.array(args[-1]), ("data",))
        self.data = jax.NamedSharding(self.mesh, jax.P("data"))
        self.replicated = jax.NamedSharding(self.mesh, jax.P())
        super().__init__(*args)
        self.guidance = global_array(np.float32(self.plan.guidance_scale), self.replicated)
        self.latent_shape = (self.plan.per_device_batch_size, self.pipeline.unet.config.in_channels,
                             self.height // self.pipeline.vae_scale_factor,
                             self.width // self.pipeline.vae_scale_factor)

    def place_ids(self, ids: np.ndarray):
        return global_array(ids, self.data)

    def place_keys(self, keys: np.ndarray):
        return global_array(keys, self.data)

    def _args(self, ids, keys) -> tuple:
        args = (ids, self.params, keys, self.guidance)
        return args + (self.negative_ids,) if self.negative_ids is not None else args

    def lower(self):
        import jax
        import jax.numpy as jnp

        pipeline, plan, shape = self.pipeline, self.plan, self.latent_shape

        def generate(ids, params, keys, guidance, negative_ids=None):
            # Device d's latents are normal(key_d, (per_device_batch, C, h, w)), as under pmap.
            latents = jax.vmap(lambda key: jax.random.normal(key, shape, dtype=jnp.float32))(keys)
            latents = latents.reshape((-1,) + shape[1:])
            return pipeline._generate(ids, params, keys[0], plan.num_inference_steps, self.height, self.width,
                                      guidance, latents, negative_ids)

        shardings = (self.data, self.replicated, self.data, self.replicated)
        if self.negative_ids is not None:
            shardings += (self.data,)
        function = jax.jit(generate, in_shardings=shardings, out_shardings=self.data)
        return function.lower(*self._args(*self.inputs(0)))

    def run(self, ids, keys):
        return self.compiled(*self._args(ids, keys))

    def fetch(self, out) -> np.ndarray:
        import jax
        from jax.experimental import multihost_utils

        if jax.process_count() > 1:
            out = multihost_utils.process_allgather(out, tiled=True)
        return np.asarray(out)


GENERATORS = {"pmap": PmapGenerator, "sharded": ShardedGenerator}
