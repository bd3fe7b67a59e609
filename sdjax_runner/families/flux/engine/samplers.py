"""FLUX.1's denoising stage per sampler: ``euler`` on the model's own schedule (diffusers' FluxPipeline:
:func:`.stages.euler`), and the k samplers (engine/samplers/k_samplers.py, the same functions the SD family
runs) as ComfyUI runs them on a flow model: its ``CONST`` model sampling -- the sample starts as ``sigma_0 *
noise`` (``noise_scaling`` with an empty latent), the denoiser is ``x - sigma * v`` with the transformer's
velocity ``v`` at timestep ``sigma`` (``calculate_denoised``), the result divided by ``1 - sigma_last`` = 1
(``inverse_noise_scaling``) -- on ComfyUI's schedules over the flow sigmas (:mod:`.sigmas`). The latents are
the packed tokens throughout; the transformer computes in the activations dtype, the sampler in float32."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sdjax_runner.config.samplers import FLOW_K_SAMPLERS
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.modes.start import Start
from sdjax_runner.engine.samplers.k_samplers import K_SAMPLERS
from sdjax_runner.families.flux.engine import sigmas as flow
from sdjax_runner.families.flux.engine import stages


def k_sampler(name: str, family_stages: Any = stages) -> Callable:
    """The denoising stage of k sampler ``name`` on FLUX.1 (module docstring) -- or on another flow-matching
    family whose stage module (``family_stages``: SD 3's, families/sd3/engine/stages.py) has the same ``pack``, ``unpack``,
    ``latent_side``, ``velocity_model`` (taking sigma in [0, 1]), ``noised_start`` and ``euler``, and where its model
    sampling is not FLUX.1's a ``sigma_table(pipeline, spec)`` (FLUX.2's); ``euler`` without a schedule
    (``spec.sigmas`` None) is diffusers' Euler on the model's own schedule."""

    def denoise(pipeline: Any, params: dict, conditioning: Conditioning, start: Start, guidance, spec: Any,
                key=None):
        import jax.numpy as jnp

        stages = family_stages
        if spec.sigmas is None:
            return stages.euler(pipeline, params, conditioning, start, guidance, spec, key)
        factor = pipeline.vae_scale_factor
        if hasattr(stages, "sigma_table"):  # a family whose model sampling is its own (FLUX.2's shift)
            table, sigma = stages.sigma_table(pipeline, spec)
        else:
            table, sigma = flow.flow_model(pipeline.scheduler_config, spec.height, spec.width, factor)
        sigmas = flow.schedule(spec.sigmas, spec.steps, table, sigma)  # host values: constants of the program
        tokens = stages.pack(start.noise)
        velocity = stages.velocity_model(pipeline, params, conditioning, guidance, spec, tokens.shape[0], sigmas)

        def denoiser(x, sigma_now):
            return x - sigma_now * velocity(x, sigma_now).astype(jnp.float32)

        first = tokens * sigmas[0] if start.image is None else stages.pack(stages.noised_start(start, sigmas))
        x = K_SAMPLERS[name](denoiser, first, sigmas, lambda i, j: jnp.zeros_like(tokens), start=start.step)
        height, width = (stages.latent_side(side, factor) for side in (spec.height, spec.width))
        return stages.unpack(x / (1.0 - sigmas[-1]), height, width)

    return denoise


SAMPLERS = {name: k_sampler(name) for name in FLOW_K_SAMPLERS}
