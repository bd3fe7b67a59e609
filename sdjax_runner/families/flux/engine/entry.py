"""FLUX.1 as the engine runs it: guidance-distilled ([dev]) or unguided ([schnell]), a negative prompt only with
true CFG; text to image with the flow-matching Euler and the flow k samplers (:mod:`.samplers`)."""

from __future__ import annotations

from sdjax_runner.engine.family import Family, around_blocks
from sdjax_runner.families.flux.engine import family as flux
from sdjax_runner.families.flux.engine import samplers, stages

FAMILY = Family("flux", check_loaded=flux.check_loaded, with_scheduler=flux.with_scheduler, tokens=flux.FluxTokens,
                negative=flux.negative, encode=stages.encode, modes={"txt2img": stages.txt2img, "img2img": stages.img2img, "inpaint": stages.inpaint,
                       "edit": stages.edit, "control": stages.control,
                       "control_img2img": stages.control_img2img, "control_inpaint": stages.control_inpaint,
                       "controlnet": stages.controlnet},
                samplers=samplers.SAMPLERS, decode=stages.decode, structure=flux.structure,
                denoiser_call=flux.transformer_call, guidance=flux.guidance, split_weights=flux.split_weights,
                skipped_calls=around_blocks(stages.SKIPPED_CALLS), load_controlnet=flux.load_controlnet)
