"""A1111's "Hires. fix": the second pass of a text-to-image program (config/hires.py; ``sampling.hires.*``), as
A1111's ``StableDiffusionProcessingTxt2Img.sample_hr_pass`` runs it, inside the same traced program:

1. the first pass's latents are upscaled -- in latent space (its "Latent" upscalers) or decoded, resized as 8-bit
   pixels with Lanczos and encoded again (the VAE's posterior sampled), :mod:`.upscale`;
2. the conditioning is the first pass's, at the new size (SDXL's size conditioning: A1111's ``calculate_hr_conds``
   gives the upscaled width and height);
3. noise of the new size is drawn from the device's key (A1111 draws it from the same seeds as the first pass's)
   and the family's sampler runs image to image: the last ``steps`` steps of a ``schedule``-step schedule
   (:class:`HiresPass`). With the Lanczos upscaler the pass is the image-to-image mode's run on the upscaled 8-bit
   image, at the upscaled size, with the same key (``tests/test_hires.py`` checks it so). A1111's "Hires sampler" and
   "Hires CFG Scale" give the pass a k sampler and a guidance scale of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from sdjax_runner.engine.modes.start import Start
from sdjax_runner.engine.upscale import LATENT, upscale_latents, upscale_pixels


@dataclass(frozen=True)
class HiresPass:
    """What shapes a program's second pass (a :class:`~.program.Spec` field)."""

    height: int  # the upscaled size, pixels
    width: int
    schedule: int  # the steps of the schedule it runs the end of
    start: int  # the schedule's step it starts at (schedule - the steps it runs)
    upscaler: str  # a config/hires.py name
    sampler: str = ""  # a k sampler of its own (sampling.hires.sampler) and its sigma schedule; "": the run's
    sigmas: Optional[str] = None
    guided: bool = False  # its own guidance scale is an input ("hires_guidance"; sampling.hires.guidance_scale)
    cfg: bool = True  # classifier-free guidance runs in it (SD: its guidance over 1; engine/program.py's Spec.cfg)

    @property
    def steps(self) -> int:
        """The steps it runs."""
        return self.schedule - self.start


def second_pass(family: Any, pipeline: Any, params: dict, conditioning: Any, latents, guidance, spec: Any, key):
    """The final latents of the second pass, from the first pass's ``latents``. ``family``: the model's
    engine/families.Family (its modes, samplers and decoder); ``conditioning``: the first pass's at the upscaled
    size (``family.at_size``; its conditional half alone where the pass runs no CFG); ``guidance``: the pass's;
    ``spec``: the program's Spec (``spec.hires`` the pass)."""
    hires: HiresPass = spec.hires
    second = replace(spec, height=hires.height, width=hires.width, steps=hires.schedule, mode="img2img", hires=None,
                     cfg=hires.cfg)
    if hires.sampler:  # its own k sampler, at its default eta
        second = replace(second, sampler=hires.sampler, sigmas=hires.sigmas, eta=None)
    batch = latents.shape[0]
    if hires.upscaler in LATENT:
        factor = pipeline.vae_scale_factor
        image = upscale_latents(latents, hires.height // factor, hires.width // factor, hires.upscaler)
        start = Start(family.modes["txt2img"](pipeline, params, key, second, batch, {}).noise, image=image,
                      step=hires.start)
    else:  # decoded, resized as 8-bit pixels, encoded again: the image-to-image mode's start from that image
        pixels = upscale_pixels(family.decode(pipeline, params, latents), hires.height, hires.width)
        init = (2 * pixels - 1).transpose(0, 3, 1, 2)
        start = family.modes["img2img"](pipeline, params, key, second, batch, {"init": init, "start": hires.start})
    return family.samplers[second.sampler](pipeline, params, conditioning, start, guidance, second, key)
