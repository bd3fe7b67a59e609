"""The runner's images equal the Diffusers JAX guide's hand-written flow, pixel for pixel."""

import functools

import jax
import jax.numpy as jnp
import pytest
import numpy as np
from PIL import Image

from conftest import run_cli
from test_configs import compose_cfg


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


def runner_images(run_dir):
    return [np.asarray(Image.open(f)) for f in sorted((run_dir / "images").glob("*.png"))]


def assert_same_pixels(got, expected):
    assert len(got) == len(expected) == jax.device_count()
    for index, (mine, theirs) in enumerate(zip(got, expected)):
        assert np.array_equal(mine, theirs), f"image {index} differs from the guide's"


def test_same_prompt_run_equals_the_guide(smoke_run, tiny_model_dir):
    _, run_dir, _ = smoke_run
    prompt = compose_cfg(["+experiment=smoke"]).prompts.texts[0]
    assert_same_pixels(runner_images(run_dir), guide_images(tiny_model_dir, [prompt] * jax.device_count(), seed=0))


def test_different_prompts_run_equals_the_guide(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "prompts=guide_eight", "seed=3", "sampling.guidance_scale=5.0",
                     "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    prompts = list(compose_cfg(["prompts=guide_eight"]).prompts.texts)
    expected = guide_images(tiny_model_dir, prompts, seed=3, guidance_scale=5.0)
    assert_same_pixels(runner_images(run_dir), expected)


def test_negative_prompt_equals_the_guide_and_changes_the_images(smoke_run, tmp_path, tiny_model_dir):
    _, plain_dir, _ = smoke_run
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", 'prompts.negative="blurry, low quality"', "tracking=none",
                     f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    prompt = compose_cfg(["+experiment=smoke"]).prompts.texts[0]
    got = runner_images(run_dir)
    assert_same_pixels(got, guide_images(tiny_model_dir, [prompt] * 8, seed=0, negative="blurry, low quality"))
    assert not any(np.array_equal(a, b) for a, b in zip(got, runner_images(plain_dir)))
