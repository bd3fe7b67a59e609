"""The Diffusers JAX guide's own code, to compare the runner's images with."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.lru_cache(maxsize=1)
def guide_pipeline(model_dir):
    """The guide's loading and replication, done once per test process (replicate takes ~15 s here)."""
    from diffusers import FlaxStableDiffusionPipeline
    from flax.jax_utils import replicate

    pipeline, params = FlaxStableDiffusionPipeline.from_pretrained(
        str(model_dir), dtype=jnp.float32, safety_checker=None, feature_extractor=None)
    return pipeline, replicate(params)


def guide_images(model_dir, prompts, seed, steps=4, height=64, width=64, guidance_scale=7.5, negative=None):
    """The guide's code, verbatim but for the model path and the sampling arguments."""
    from flax.training.common_utils import shard

    pipeline, p_params = guide_pipeline(model_dir)
    prompt_ids = pipeline.prepare_inputs(prompts)
    prompt_ids = shard(prompt_ids)
    rng = jax.random.split(jax.random.PRNGKey(seed), jax.device_count())
    neg_prompt_ids = shard(pipeline.prepare_inputs([negative] * len(prompts))) if negative else None
    images = pipeline(prompt_ids, p_params, rng, num_inference_steps=steps, height=height, width=width,
                      guidance_scale=guidance_scale, neg_prompt_ids=neg_prompt_ids, jit=True).images
    images = images.reshape((images.shape[0] * images.shape[1],) + images.shape[-3:])
    return [np.asarray(image) for image in pipeline.numpy_to_pil(images)]


def assert_same_pixels(got, expected):
    assert len(got) == len(expected) == jax.device_count()
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert np.array_equal(mine, theirs), f"image {index} differs from the guide's"


def diffusers_images(model_dir, prompts, seed, pipeline_class="FlaxStableDiffusionPipeline", negative=None,
                     steps=4, size=64, guidance_scale=7.5):
    """diffusers 0.39's own Flax pipeline ``pipeline_class``, loaded by its own ``from_pretrained`` from
    ``model_dir`` (its scheduler and tokenizers as the folder names them) and called the guide's way
    (pmapped, ``jit=True``). ``negative``: a negative prompt for every image (None: the pipeline's own
    unconditional input). Returns the images and the pipeline."""
    import diffusers
    from flax.jax_utils import replicate
    from flax.training.common_utils import shard

    cls = getattr(diffusers, pipeline_class)
    kwargs = {} if "XL" in pipeline_class else {"safety_checker": None, "feature_extractor": None}
    pipeline, params = cls.from_pretrained(str(model_dir), dtype=jnp.float32, **kwargs)
    prompt_ids = shard(pipeline.prepare_inputs(prompts))
    neg_prompt_ids = None if negative is None else shard(pipeline.prepare_inputs([negative] * len(prompts)))
    rng = jax.random.split(jax.random.PRNGKey(seed), jax.device_count())
    images = pipeline(prompt_ids, replicate(params), rng, num_inference_steps=steps, height=size, width=size,
                      guidance_scale=guidance_scale, neg_prompt_ids=neg_prompt_ids, jit=True).images
    images = images.reshape((images.shape[0] * images.shape[1],) + images.shape[-3:])
    return [np.asarray(image) for image in pipeline.numpy_to_pil(np.asarray(images))], pipeline
