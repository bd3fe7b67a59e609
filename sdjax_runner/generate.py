"""Sharded batches -> images and timings, on the guide's pmap path.

The function that runs is diffusers' own ``_p_generate`` -- what
``pipeline(prompt_ids, params, rng, jit=True)`` calls -- compiled ahead of
time so compilation is timed apart from execution. Its outputs are therefore
the guide's images, bit for bit.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np

from sdjax_runner.parallel import shard
from sdjax_runner.plan import Plan


def batch_keys(seed: int, batch: int, num_devices: int):
    """Per-device PRNG keys: the guide's split(PRNGKey(seed)) for batch 0, fold_in(batch) after."""
    import jax

    key = jax.random.PRNGKey(seed)
    if batch:
        key = jax.random.fold_in(key, batch)
    return jax.random.split(key, num_devices)


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


class PmapGenerator:
    """One job's batches through diffusers' pmapped generate function."""

    def __init__(self, pipeline: Any, params: dict, safety_params: Any, plan: Plan, height: int, width: int):
        import jax.numpy as jnp

        self.pipeline, self.params, self.safety_params = pipeline, params, safety_params
        self.plan, self.height, self.width = plan, height, width
        self.timings = Timings()
        # As pipeline.__call__ builds it from a float guidance scale: one per device, float32.
        self.guidance = jnp.array([plan.guidance_scale] * plan.num_devices)[:, None]
        self.negative_ids = None
        if plan.negative:
            ids = pipeline.prepare_inputs([plan.negative] * plan.images_per_batch)
            self.negative_ids = shard(ids, plan.num_devices)
        self.compiled: Optional[Callable] = None

    def inputs(self, batch: int):
        ids = self.pipeline.prepare_inputs(self.plan.batch_prompts(batch))
        return shard(ids, self.plan.num_devices), batch_keys(self.plan.seed, batch, self.plan.num_devices)

    def lower(self):
        """The guide's ``pipeline(..., jit=True)`` program, lowered for this job's shapes."""
        from diffusers.pipelines.stable_diffusion.pipeline_flax_stable_diffusion import _p_generate

        ids, keys = self.inputs(0)
        return _p_generate.lower(self.pipeline, ids, self.params, keys, self.plan.num_inference_steps,
                                 self.height, self.width, self.guidance, None, self.negative_ids)

    def run(self, ids, keys):
        """One batch, asynchronously: a (devices, per_device, H, W, 3) float array in [0, 1]."""
        return self.compiled(ids, self.params, keys, self.guidance, None, self.negative_ids)

    def _timed(self, ids, keys) -> tuple[Any, float]:
        started = time.perf_counter()
        out = self.run(ids, keys).block_until_ready()
        return out, time.perf_counter() - started

    def generate(self, progress: Callable[[Iterator[int]], Iterator[int]] = iter) -> Iterator[np.ndarray]:
        """Yield each batch's images (N, H, W, 3) as uint8, recording timings."""
        for batch in progress(iter(range(self.plan.num_batches))):
            ids, keys = self.inputs(batch)
            out, seconds = self._timed(ids, keys)
            if batch == 0:
                self.timings.first_batch_s = seconds
            else:
                self.timings.steady_s.append(seconds)
            yield self._to_uint8(np.asarray(out))
        ids, keys = self.inputs(0)
        while len(self.timings.steady_s) < self.plan.repeats:
            self.timings.steady_s.append(self._timed(ids, keys)[1])

    def _to_uint8(self, images: np.ndarray) -> np.ndarray:
        flat = images.reshape((-1,) + images.shape[-3:])
        pixels = (flat * 255).round().astype("uint8")  # as pipeline.numpy_to_pil does
        if self.pipeline.safety_checker is not None:
            pixels, _ = self.pipeline._run_safety_checker(pixels, self.safety_params, jit=False)
        return pixels
