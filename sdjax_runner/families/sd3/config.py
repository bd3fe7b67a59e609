"""What the config knows of SD 3 / 3.5 (config/families.py's entry for it): diffusers' StableDiffusion3Pipeline's
defaults, its built-in models, the components a single file may hold, the largest size its position table takes,
and the settings it has no use for (yet), each refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config import guiders, samplers
from sdjax_runner.config.family_entry import MAX_INDEX_BYTES, FamilyEntry, read_as_written
from sdjax_runner.config.modes import flow_start_step
from sdjax_runner.config.weight_files import Architecture
from sdjax_runner.console import shown
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.config import flow_inpaint, uncached_mode
from sdjax_runner.files import read_json

SINGLE_FILES = {"sd3": Architecture("SD 3", "stabilityai/stable-diffusion-3-medium-diffusers"),
                "sd3.5-large": Architecture("SD 3.5 Large", "stabilityai/stable-diffusion-3.5-large"),
                "sd3.5-medium": Architecture("SD 3.5 Medium", "stabilityai/stable-diffusion-3.5-medium")}

# SD 3's components a file may hold besides the MMDiT: component -> its tensors' prefix (models/single_file.py reads
# them from there).
INSIDE = {"text_encoder": "text_encoders.clip_l.transformer.", "text_encoder_2": "text_encoders.clip_g.transformer.",
          "text_encoder_3": "text_encoders.t5xxl.transformer.", "vae": "first_stage_model."}
# The tensor that says a component is there (diffusers' is_clip_sd3_model, is_open_clip_sd3_model,
# is_t5_in_single_file; any first_stage_model tensor for the VAE).
MARKERS = {"text_encoder": "text_encoders.clip_l.transformer.text_model.embeddings.position_embedding.weight",
           "text_encoder_2": "text_encoders.clip_g.transformer.text_model.embeddings.position_embedding.weight",
           "text_encoder_3": "text_encoders.t5xxl.transformer.shared.weight"}


def components_inside(keys) -> tuple[str, ...]:
    """The components besides the transformer whose weights an SD 3 file holds, in :data:`INSIDE`'s order."""
    names = set(keys)
    found = [name for name, marker in MARKERS.items() if marker in names]
    if any(key.startswith(INSIDE["vae"]) for key in names):
        found.append("vae")
    return tuple(name for name in INSIDE if name in found)


def skip_layer_sampler(config: Any) -> None:
    """guider=skip_layer counts the model's own schedule's steps (its window): another sampler or schedule is one
    line."""
    sampler, entry = config.sampler, guiders.GUIDERS.get(str(config.guider.name))
    if entry is not None and entry.skips and samplers.resolve_flow(sampler, config.scheduler.name).sigmas is not None:
        raise UserError("guider", f"{entry.name} with sampler {sampler} and scheduler {config.scheduler.name}: "
                        "skip-layer guidance counts the model's own schedule's steps", "the flow-matching Euler on "
                        "the model's schedule (sampler=euler, or null), or another guider")


def read_infotext(reading: Any) -> None:
    """SD 3's A1111 keys (config/infotext.py): skip-layer guidance as the runner wrote it before it became a guider
    (``Skip layer guidance: "7,8,9"``, ``SLG scale``, ``SLG start``, ``SLG stop``) honoured as ``guider=skip_layer``;
    ``Shift`` said (the model's scheduler config sets it)."""
    settings, numbers = reading.settings, reading.numbers
    if "Skip layer guidance" in settings:
        layers = [part.strip() for part in settings["Skip layer guidance"].split(",")]
        if not all(part.isascii() and part.isdigit() and len(part) < 4 for part in layers):  # not '²'
            raise UserError("Skip layer guidance", f"{shown(settings['Skip layer guidance'])[:300]}",
                            "block numbers separated by commas, e.g. \"7,8,9\"")
        reading.use("Skip layer guidance", "guider=skip_layer")
        reading.out.append(f"guider.layers=[{','.join(str(int(part)) for part in layers)}]")
        for key, name in (("SLG scale", "scale"), ("SLG start", "skip_start"), ("SLG stop", "skip_stop")):
            if key in numbers:
                reading.use(key, f"guider.{name}={numbers[key]!r}")
    if "Shift" in settings:
        reading.skip("Shift", "the model's scheduler config sets it (its scheduler/scheduler_config.json)")


def architecture_of(keys: frozenset[str], name: str = "") -> Optional[str]:
    """"sd3.5-medium" (dual attention: x_block.attn2), "sd3.5-large" (q/k norms: ln_q) or "sd3" for an SD 3 MMDiT
    in Stability AI's layout (sd3.5_large.safetensors: model.diffusion_model.joint_blocks.*; the text encoders
    inside or not), else None. SD 3.5 Large Turbo has Large's keys (and base)."""
    inner = {k.removeprefix("model.diffusion_model.") for k in keys}
    if not any(k.startswith("joint_blocks.") for k in inner):
        return None
    if any(".x_block.attn2." in k for k in inner):
        return "sd3.5-medium"
    return "sd3.5-large" if any(".attn.ln_q." in k for k in inner) else "sd3"


def controlnet_guidance(config: Any) -> None:
    """mode=controlnet runs the ControlNet beside the guidance halves' transformer call, as diffusers'
    StableDiffusion3ControlNetPipeline does: a guider that makes other calls (PAG's and SEG's perturbed one,
    skip-layer guidance's) and a step cache (whose skipped calls would skip the residuals) are one line each."""
    if config.mode.name not in ("controlnet", "controlnet_inpaint"):
        return
    if config.guider.name not in guiders.COMBINING:
        raise UserError("guider", f"{config.guider.name} with mode={config.mode.name}: its extra transformer call has no "
                        "ControlNet residuals defined (diffusers' SD 3 ControlNet pipeline has none)",
                        ", ".join(guiders.COMBINING))
    uncached_mode(config)


def _sd3_values(config: Any) -> None:
    """Settings SD 3 has no use for (yet), each refused in one line rather than ignored."""
    flow_inpaint(config, "SD 3")
    skip_layer_sampler(config)
    controlnet_guidance(config)
    read_as_written(config, "SD 3", "SD 3 reads its CLIP encoders' penultimate layer, as diffusers does")


def _sd3_largest_side(folder: Path) -> Optional[tuple[int, str]]:
    """SD 3's transformer adds position embeddings cropped from a ``pos_embed_max_size`` square table of patches:
    latents larger than it have none (diffusers: a ValueError). None where the folder's configs cannot tell."""
    try:
        transformer = read_json(folder / "transformer" / "config.json", MAX_INDEX_BYTES)
        vae = read_json(folder / "vae" / "config.json", MAX_INDEX_BYTES)
        table, patch = int(transformer["pos_embed_max_size"]), int(transformer.get("patch_size", 2))
        factor = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return table * patch * factor, f"its transformer's position table is {table}x{table} patches of {patch}x{patch} latents"


# diffusers' StableDiffusion3Pipeline defaults: 28 steps, guidance 7.0, 256 T5 tokens.
ENTRY = FamilyEntry("sd3", "Stable Diffusion 3 / 3.5: CLIP-L, CLIP-G and T5 text encoders, an MMDiT, a 16-channel VAE",
                    ("StableDiffusion3Pipeline",), tiny="tiny-random-sd3",
                    modes=("txt2img", "img2img", "inpaint", "controlnet", "controlnet_inpaint"),
                    start_step=flow_start_step,  # StableDiffusion3Img2ImgPipeline.get_timesteps
                    builtins=("tiny-random-sd3", "sd3.5-large-arch"), steps=28, guidance=7.0, check=_sd3_values,
                    sampling=samplers.resolve_flow, t5_tokens=256, t5_optional=True, scheduler_settings=False,
                    checkpoint_holds=lambda keys: ("transformer",) + components_inside(keys),
                    a1111_prompts=False, guiders=(*guiders.COMBINING, "pag", "seg", "skip_layer"),
                    perturbed_layers=("blocks.1",),
                    caches=("none", "first_block"),  # on its own Euler sampler (config/caches.check)
                    largest_side=_sd3_largest_side,
                    single_files=SINGLE_FILES, architecture_of=architecture_of,
                    short="SD 3", infotext_keys=("Shift", "Skip layer guidance"), read_infotext=read_infotext)
