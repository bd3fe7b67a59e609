"""What the config knows of the Stable Diffusion family (config/families.py's entry for it): the published
pipelines it runs, every mode, its built-in models, and what only it takes (textual-inversion embeddings, CFG
rescale, the SDXL refiner, every guider)."""

from __future__ import annotations

from typing import Optional

from sdjax_runner.config import guiders
from sdjax_runner.config.family_entry import FamilyEntry
from sdjax_runner.config.weight_files import KEY, Architecture
from sdjax_runner.errors import UserError

SINGLE_FILES = {"sd1": Architecture("SD 1.x", "stable-diffusion-v1-5/stable-diffusion-v1-5"),
                "sd2": Architecture("SD 2.x", "stabilityai/stable-diffusion-2-1"),
                "sdxl": Architecture("SDXL", "stabilityai/stable-diffusion-xl-base-1.0")}


def architecture_of(keys: frozenset[str], name: str) -> Optional[str]:
    """"sdxl", "sd2" or "sd1" for a UNet in the original (LDM) layout (model.diffusion_model.input_blocks.*), told
    apart by its text encoder(s); an SDXL refiner's file or a UNet without a text encoder this runner knows is
    one line; None for a file without such a UNet."""
    has = lambda prefix: any(k.startswith(prefix) for k in keys)  # noqa: E731
    if not has("model.diffusion_model.input_blocks."):
        return None
    if has("conditioner.embedders.1.model.transformer."):
        return "sdxl"
    if has("conditioner.embedders.0.model."):
        raise UserError(KEY, f"{name} is an SDXL refiner checkpoint, which this runner does not run",
                        "an SD 1.x, 2.x or SDXL base single-file checkpoint")
    if has("cond_stage_model.model.transformer."):
        return "sd2"
    if has("cond_stage_model.transformer."):
        return "sd1"
    raise UserError(KEY, f"{name} has a UNet but no text encoder this runner knows (SD 1.x, 2.x or SDXL)",
                    "an SD 1.x, 2.x or SDXL single-file checkpoint")


# An inpainting model's pipeline (runwayml/stable-diffusion-inpainting) holds the same components; its UNet reads 9
# channels (engine/modes/inpaint.py).
ENTRY = FamilyEntry("sd", "Stable Diffusion 1.x, 2.x and XL: CLIP text encoder(s), UNet, VAE",
                    ("StableDiffusionPipeline", "StableDiffusionInpaintPipeline", "StableDiffusionXLPipeline",
                     "StableDiffusionXLInpaintPipeline"), tiny="tiny-random",
                    modes=("txt2img", "img2img", "inpaint", "controlnet"),
                    builtins=("tiny-random", "tiny-random-xl", "sd-v1-arch", "sdxl-arch", "tiny-random-inpaint"),
                    embeddings=True, guidance_rescale=True, refiner=True, guiders=guiders.ON_A_UNET,
                    single_files=SINGLE_FILES, architecture_of=architecture_of, short="SD",
                    caches=("none", "deepcache"))  # on its own scheduler (config/caches.check)
