"""SD 3 / 3.5 as the engine runs it: classifier-free guidance with a negative prompt; text to image with the
flow-matching Euler and FLUX.1's flow k samplers (families/flux/engine/samplers.py) on SD 3's velocity."""

from __future__ import annotations

from sdjax_runner.engine.family import Family, around_blocks
from sdjax_runner.families.flux.engine import family as flux
from sdjax_runner.families.flux.engine import samplers as flux_samplers
from sdjax_runner.families.sd3.engine import family as sd3
from sdjax_runner.families.sd3.engine import stages

FAMILY = Family("sd3", check_loaded=sd3.check_loaded, with_scheduler=flux.with_scheduler, tokens=sd3.SD3Tokens,
                negative=sd3.negative, encode=stages.encode, modes={"txt2img": stages.txt2img, "img2img": stages.img2img, "inpaint": stages.inpaint,
                       "controlnet": stages.controlnet, "controlnet_inpaint": stages.controlnet_inpaint},
                samplers={name: flux_samplers.k_sampler(name, stages) for name in flux_samplers.SAMPLERS},
                decode=stages.decode, structure=sd3.structure, denoiser_call=sd3.transformer_call,
                split_weights=sd3.split_weights, shift=lambda pipeline: float(pipeline.scheduler_config["shift"]),
                skipped_calls=around_blocks(stages.SKIPPED_CALLS), load_controlnet=sd3.load_controlnet)
