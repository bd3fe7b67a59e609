"""The runner's images equal the Diffusers JAX guide's hand-written flow, pixel for pixel."""

import jax
import numpy as np
import pytest

from helpers.cli import run_cli
from helpers.configs import compose_cfg
from helpers.guide import assert_same_pixels, guide_images
from helpers.images import images_of as runner_images

pytestmark = pytest.mark.slow


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
    assert not any(np.array_equal(a, b) for a, b in zip(got, runner_images(plain_dir), strict=True))
