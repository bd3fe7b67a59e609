"""What the config knows of FLUX.1 (config/families.py's entry for it): diffusers' FluxPipeline's defaults,
its built-in models, and the settings it has no use for, each refused in one line."""

from __future__ import annotations

import math
from typing import Any, Optional

from sdjax_runner.config import caches, guiders, samplers
from sdjax_runner.config.family_entry import FamilyEntry, read_as_written
from sdjax_runner.config.modes import flow_start_step
from sdjax_runner.config.weight_files import Architecture
from sdjax_runner.errors import UserError

SINGLE_FILES = {"flux-dev": Architecture("FLUX.1 [dev]", "black-forest-labs/FLUX.1-dev"),
                "flux-schnell": Architecture("FLUX.1 [schnell]", "black-forest-labs/FLUX.1-schnell")}
# A FLUX.1 transformer in Black Forest Labs' own layout (flux1-dev.safetensors; ComfyUI's saves add
# model.diffusion_model.): its double- and single-stream blocks by their original names.
PREFIXES = ("", "model.diffusion_model.")


def architecture_of(keys: frozenset[str], name: str = "") -> Optional[str]:
    """"flux-dev" / "flux-schnell" for a FLUX.1 transformer in Black Forest Labs' layout (with or without
    ComfyUI's model.diffusion_model. prefix; [dev] has the guidance embedder guidance_in.*), else None. Its double
    blocks modulate themselves (img_mod): FLUX.2's, in the same layout, share one modulation and are not FLUX.1's."""
    for prefix in PREFIXES:
        inner = {k[len(prefix):] for k in keys if k.startswith(prefix)}
        if any(k.startswith("double_blocks.") and ".img_mod." in k for k in inner) \
                and any(k.startswith("single_blocks.") for k in inner):
            return "flux-dev" if any(k.startswith("guidance_in.") for k in inner) else "flux-schnell"
    return None


def flow_inpaint(config: Any, title: str) -> None:
    """Inpainting on a flow model (FLUX.1, SD 3) sets the kept area back after each step of the model's own Euler,
    as diffusers' inpaint pipelines do: a k sampler (which would need ComfyUI's blending of its denoised sample) and a
    step cache (its state would not see the blend) are one line each."""
    if config.mode.name not in ("inpaint", "control_inpaint"):
        return
    if samplers.resolve_flow(config.sampler, config.scheduler.name).sigmas is not None:
        raise UserError("sampler", f"{config.sampler} with mode={config.mode.name}: {title} inpaints on its own Euler, as "
                        "diffusers' inpaint pipeline does", "null (the model's Euler)")
    if config.cache.name != caches.DEFAULT:
        raise UserError("cache", f"{config.cache.name} with mode={config.mode.name}: the blend after each step is not run under "
                        "a step cache yet", "none")


# The modes a step cache does not run with yet, and why (inpainting's: flow_inpaint); SD 3's too (families/sd3/config.py)
_CONTROLNET_UNCACHED = "the ControlNet's residuals reach every block, which a cached call skips; not run here yet"
UNCACHED_MODES = {"edit": "the cache's state does not follow the input image's tokens yet",
                  "controlnet": _CONTROLNET_UNCACHED, "controlnet_inpaint": _CONTROLNET_UNCACHED}


def uncached_mode(config: Any) -> None:
    """A step cache with a mode of :data:`UNCACHED_MODES`: one line, saying why."""
    uncached = UNCACHED_MODES.get(config.mode.name)
    if uncached is not None and config.cache.name != caches.DEFAULT:
        raise UserError("cache", f"{config.cache.name} with mode={config.mode.name}: {uncached}", "none")


def _flux_values(config: Any) -> None:
    """Settings FLUX.1 has no use for, each refused in one line rather than ignored."""
    flow_inpaint(config, "FLUX.1")
    uncached_mode(config)
    prompts, true_cfg = config.prompts, config.sampling.true_cfg_scale
    if true_cfg is not None and not (math.isfinite(true_cfg) and true_cfg > 1):
        raise UserError("sampling.true_cfg_scale", f"{true_cfg}: true classifier-free guidance runs above 1",
                        "a number over 1 (with prompts.negative), or null")
    if prompts.negative is not None and true_cfg is None:
        raise UserError("prompts.negative", f"{config.model.name} is FLUX.1, which is guidance-distilled: it reads a "
                        "negative prompt only with true classifier-free guidance", "null, or with "
                        "sampling.true_cfg_scale=4 (say)")
    windowed = (config.guider.start, config.guider.stop) != (0.0, 1.0)
    if (config.guider.name != guiders.DEFAULT or windowed) and true_cfg is None \
            and config.guider.name in guiders.COMBINING:  # (the others: the family's list, config/guiders.check)
        raise UserError("guider", f"{config.guider.name}{' with a window' if windowed else ''}: FLUX.1 combines two "
                        "predictions only with true CFG (its guidance is distilled)",
                        f"cfg, or {config.guider.name} with sampling.true_cfg_scale and prompts.negative")
    if true_cfg is not None and prompts.negative is None:
        raise UserError("sampling.true_cfg_scale", f"{true_cfg}: true classifier-free guidance needs a negative prompt",
                        "null, or with prompts.negative=TEXT")
    read_as_written(config, "FLUX.1", "FLUX.1 reads CLIP's pooled output, which has no layer to skip to")


# diffusers' FluxPipeline defaults: 28 steps, guidance 3.5 ([schnell] reads none: its check is the engine's, once the
# transformer's config says which it is).
ENTRY = FamilyEntry("flux", "FLUX.1: CLIP-L and T5 text encoders, a flow-matching transformer, a 16-channel VAE",
                    ("FluxPipeline", "FluxFillPipeline", "FluxKontextPipeline", "FluxControlPipeline"),
                    tiny="tiny-random-flux", modes=("txt2img", "img2img", "inpaint", "edit", "control",
                                                   "control_img2img", "control_inpaint", "controlnet"),
                    start_step=flow_start_step,  # FluxImg2ImgPipeline.get_timesteps
                    builtins=("tiny-random-flux", "tiny-random-flux-schnell", "tiny-random-flux-kontext",
                              "tiny-random-flux-fill", "tiny-random-flux-control", "flux-dev-arch"),
                    steps=28, guidance=3.5, check=_flux_values, sampling=samplers.resolve_flow, t5_tokens=512,
                    checkpoint_holds=lambda keys: ("transformer",), a1111_prompts=False, true_cfg=True,
                    guiders=guiders.COMBINING,  # on its true CFG (_flux_values)
                    sampler_names_scheduler=True, scheduler_settings=False, single_files=SINGLE_FILES,
                    architecture_of=architecture_of, short="FLUX.1", infotext_keys=("Distilled CFG Scale",),
                    caches=("none", "first_block", "magcache"))  # on its own Euler sampler (config/caches.check)
