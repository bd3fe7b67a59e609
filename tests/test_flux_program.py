"""FLUX.1's program stages (families/flux/engine/stages.py) against diffusers 0.39's PyTorch FluxPipeline called with the
runner's noise (tests/fixtures/flux/pipeline_*.npz, made by tests/helpers/make_flux_reference.py): the
schedule, the tokens, the conditioning and the images, for [dev] (guidance embedding, dynamic shift) and
[schnell]."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from helpers.compile_options import USERS_COMPILE
from sdjax_runner.engine.guiders import Guidance

pytestmark = pytest.mark.slow  # each variant's program compiles once (about 15 s)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "flux"
VARIANTS = ["dev", "schnell"]


def _loaded(variant: str):
    from sdjax_runner.config.schema import DtypeConfig, ModelConfig
    from sdjax_runner.families.flux.models.pipeline import load_flux
    from sdjax_runner.models.model_index import read

    folder = FIXTURES / f"tiny-flux-{variant}"
    model = ModelConfig(name=f"tiny-flux-{variant}", pretrained_model_name_or_path=str(folder))
    return load_flux(folder, read(folder), model, DtypeConfig(name="fp32"), None, None)


@pytest.fixture(scope="module", params=VARIANTS)
def run(request):
    """The stages run once per variant: each device's image as the runner computes it, and the reference."""
    import jax

    from sdjax_runner.engine.generate import batch_keys
    from sdjax_runner.families.flux.engine import stages

    ref = dict(np.load(FIXTURES / f"pipeline_{request.param}.npz"))
    loaded = _loaded(request.param)
    pipeline, params = loaded.pipeline, loaded.host_weights
    steps, height, width = int(ref["steps"]), int(ref["height"]), int(ref["width"])
    spec = SimpleNamespace(steps=steps, height=height, width=width)
    ids = stages.prompt_ids(pipeline, [str(ref["prompt"])], int(ref["max_sequence_length"]))

    def one_device(ids, params, key, guidance):
        start = stages.txt2img(pipeline, params, key, spec, 1, {})
        conditioning = stages.encode(pipeline, params, ids, None, spec, {})
        latents = stages.euler(pipeline, params, conditioning, start, Guidance(guidance), spec)
        return start.noise, conditioning, latents, stages.decode(pipeline, params, latents)

    keys = batch_keys(int(ref["seed"]), 0, int(ref["num_devices"]))
    guidance = np.float32(ref["guidance_scale"])
    # compiled as a user's program is (the suite's default leaves XLA's CPU optimizations off): the noise is
    # compared bit for bit, and the last bit of the normal sampler's polynomial depends on them
    compiled = jax.jit(one_device).lower(ids, params, keys[0], guidance).compile(compiler_options=USERS_COMPILE)
    outs = [compiled(ids, params, key, guidance) for key in keys]
    return SimpleNamespace(ref=ref, pipeline=pipeline, ids=ids, outs=outs,
                           seq_len=stages.image_seq_len(height, width, pipeline.vae_scale_factor))


def test_the_schedule_is_the_schedulers(run):
    from sdjax_runner.families.flux.engine.stages import flow_sigmas

    sigmas = flow_sigmas(int(run.ref["steps"]), run.seq_len, run.pipeline.scheduler_config)
    assert sigmas.dtype == np.float32 and np.array_equal(sigmas, run.ref["sigmas"])
    assert np.array_equal(sigmas[:-1] * np.float32(1000), run.ref["timesteps"])


def test_the_noise_and_the_conditioning_are_the_pipelines(run):
    for device, (noise, conditioning, _, _) in enumerate(run.outs):
        assert np.array_equal(np.asarray(noise)[0], run.ref["latents_unpacked"][device])  # bit for bit
        assert np.abs(np.asarray(conditioning.context)[0] - run.ref["prompt_embeds"][device]).max() < 1e-5
        assert np.abs(np.asarray(conditioning.added["pooled"])[0] - run.ref["pooled_prompt_embeds"][device]).max() < 1e-5


def test_the_images_are_diffusers_pytorch_pipelines(run):
    for device, (_, _, latents, pixels) in enumerate(run.outs):
        assert np.abs(np.asarray(latents)[0] - run.ref["final_latents"][device]).max() < 1e-4
        difference = np.abs(np.asarray(pixels)[0] - run.ref["images"][device]).max()
        assert difference <= 2 / 255, difference  # issue #46's bound; measured far below it
