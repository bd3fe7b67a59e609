"""FLUX.2 [klein] as the engine runs it: a distilled model without guidance, a base one with classifier-free guidance
and a negative prompt; text to image with the flow-matching Euler and FLUX.1's flow k samplers
(families/flux/engine/samplers.py) on FLUX.2's velocity and shift."""

from __future__ import annotations

from sdjax_runner.engine.family import Family
from sdjax_runner.families.flux.engine import family as flux
from sdjax_runner.families.flux.engine import samplers as flux_samplers
from sdjax_runner.families.flux2.engine import family as flux2
from sdjax_runner.families.flux2.engine import stages

FAMILY = Family("flux2", check_loaded=flux2.check_loaded, with_scheduler=flux.with_scheduler, tokens=flux2.Flux2Tokens,
                negative=flux2.negative, encode=stages.encode, modes={"txt2img": stages.txt2img, "edit": stages.edit, "inpaint": stages.inpaint},
                samplers={name: flux_samplers.k_sampler(name, stages) for name in flux_samplers.SAMPLERS},
                decode=stages.decode, structure=flux2.structure, denoiser_call=flux2.transformer_call,
                guidance=flux2.guidance, split_weights=flux.split_weights)
