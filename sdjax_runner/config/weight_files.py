"""The weight files a run names -- LoRA adapters and single-file checkpoints -- known from their
safetensors headers alone (milliseconds), when the plan is made: a file that is no adapter or no
Stable Diffusion checkpoint is one line before anything loads or the file is hashed (which reads
every byte). The loaders (models/lora.py, models/single_file.py) read the tensors later.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sdjax_runner.config.folder_files import check_folder, read_index
from sdjax_runner.console import one_line
from sdjax_runner.errors import UserError
from sdjax_runner.files import not_a_file

KEY = "model.checkpoint"
# The base model for each architecture when none is given: configs, tokenizers and scheduler only.
BASES = {"sd1": "stable-diffusion-v1-5/stable-diffusion-v1-5", "sd2": "stabilityai/stable-diffusion-2-1",
         "sdxl": "stabilityai/stable-diffusion-xl-base-1.0", "flux-dev": "black-forest-labs/FLUX.1-dev",
         "flux-schnell": "black-forest-labs/FLUX.1-schnell", "sd3": "stabilityai/stable-diffusion-3-medium-diffusers",
         "sd3.5-large": "stabilityai/stable-diffusion-3.5-large", "sd3.5-medium": "stabilityai/stable-diffusion-3.5-medium"}
ARCHITECTURES = {"sd1": "SD 1.x", "sd2": "SD 2.x", "sdxl": "SDXL", "flux-dev": "FLUX.1 [dev]",
                 "flux-schnell": "FLUX.1 [schnell]", "sd3": "SD 3", "sd3.5-large": "SD 3.5 Large",
                 "sd3.5-medium": "SD 3.5 Medium"}
# The model family (config/families.py) of each architecture.
FAMILY_OF = {"sd1": "sd", "sd2": "sd", "sdxl": "sd", "flux-dev": "flux", "flux-schnell": "flux", "sd3": "sd3",
             "sd3.5-large": "sd3", "sd3.5-medium": "sd3"}
# A FLUX.1 transformer in Black Forest Labs' own layout (flux1-dev.safetensors; ComfyUI's saves add
# model.diffusion_model.): its double- and single-stream blocks by their original names.
FLUX_PREFIXES = ("", "model.diffusion_model.")



def safetensors_keys(path: Path, key: str, named: str, allowed: str) -> tuple[str, ...]:
    """The tensor names in ``path``'s safetensors header (safetensors also checks that the data it
    describes fills the file exactly); a file that is not one is a UserError on ``key``, its problem
    starting with ``named``."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as tensors:
            return tuple(tensors.keys())
    except Exception as exc:  # a file is input: a bad one is one line
        raise UserError(key, f"{named} not a readable safetensors file ({one_line(exc)})",
                        allowed) from None


def lora_header(path: Path, key: str) -> None:
    """A LoRA file's header read, so that a file that is no adapter is one line before the run hashes it."""
    safetensors_keys(path, key, f"{path} is", "a LoRA .safetensors file")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    architecture: str  # "sd1", "sd2", "sdxl", "flux-dev", "flux-schnell", "sd3", "sd3.5-large", "sd3.5-medium"
    keys: tuple[str, ...]
    # From the base model's configs (see on_base): how LDM's flat layer numbers map to diffusers' blocks.
    layers_per_block: int = 2
    vae_levels: int = 4


def safetensors_file(path: Path, key: str, wanted: str, pickled: str, allowed: str) -> None:
    """One line naming ``key`` for a ``path`` that is no file (``wanted``: what it should be) or no .safetensors
    file: ``pickled`` files (say "pickled VAEs") can run code when loaded and are not read."""
    missing = not_a_file(path)
    if missing:
        raise UserError(key, f"{missing}: {path}", wanted)
    if path.suffix != ".safetensors":
        raise UserError(key, f"{path.name} is not a .safetensors file; {pickled} (.ckpt, .pt, .bin) can run code when "
                        "loaded and are not read", allowed)


def open_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint's tensor names and architecture, from its header alone (milliseconds)."""
    safetensors_file(path, KEY, "a single-file .safetensors checkpoint", "pickle checkpoints",
                     "a .safetensors checkpoint (convert a .ckpt first)")
    keys = safetensors_keys(path, KEY, f"{path.name}:", "a single-file .safetensors checkpoint")
    return Checkpoint(path, detect_architecture(path, keys), keys)


def flux_architecture(keys) -> str | None:
    """"flux-dev" / "flux-schnell" for a FLUX.1 transformer in Black Forest Labs' layout (with or without
    ComfyUI's model.diffusion_model. prefix; [dev] has the guidance embedder guidance_in.*), else None."""
    for prefix in FLUX_PREFIXES:
        inner = {k[len(prefix):] for k in keys if k.startswith(prefix)}
        if any(k.startswith("double_blocks.") for k in inner) and any(k.startswith("single_blocks.") for k in inner):
            return "flux-dev" if any(k.startswith("guidance_in.") for k in inner) else "flux-schnell"
    return None


def sd3_architecture(keys) -> str | None:
    """"sd3.5-medium" (dual attention: x_block.attn2), "sd3.5-large" (q/k norms: ln_q) or "sd3" for an SD 3 MMDiT
    in Stability AI's layout (sd3.5_large.safetensors: model.diffusion_model.joint_blocks.*; the text encoders
    inside or not), else None. SD 3.5 Large Turbo has Large's keys (and base)."""
    inner = {k.removeprefix("model.diffusion_model.") for k in keys}
    if not any(k.startswith("joint_blocks.") for k in inner):
        return None
    if any(".x_block.attn2." in k for k in inner):
        return "sd3.5-medium"
    return "sd3.5-large" if any(".attn.ln_q." in k for k in inner) else "sd3"


def detect_architecture(path: Path, keys) -> str:
    names = set(keys)
    has = lambda prefix: any(k.startswith(prefix) for k in names)  # noqa: E731
    flux = flux_architecture(names) or sd3_architecture(names)
    if flux is not None:
        return flux
    if not has("model.diffusion_model."):
        raise UserError(KEY, f"{path.name} has no model.diffusion_model.* tensors: not a Stable Diffusion checkpoint "
                        "in the original (LDM) layout", "an SD 1.x, 2.x or SDXL single-file checkpoint")
    if has("conditioner.embedders.1.model.transformer."):
        return "sdxl"
    if has("conditioner.embedders.0.model."):
        raise UserError(KEY, f"{path.name} is an SDXL refiner checkpoint, which this runner does not run",
                        "an SD 1.x, 2.x or SDXL base single-file checkpoint")
    if has("cond_stage_model.model.transformer."):
        return "sd2"
    if has("cond_stage_model.transformer."):
        return "sd1"
    raise UserError(KEY, f"{path.name} has a UNet but no text encoder this runner knows (SD 1.x, 2.x or SDXL)",
                    "an SD 1.x, 2.x or SDXL single-file checkpoint")


VAE_KEY = "model.vae"
VAE_FLAX = "diffusion_flax_model.msgpack"  # diffusers' Flax weights file
VAE_SAFETENSORS = "diffusion_pytorch_model.safetensors"


def vae_kind(path: Path) -> str:
    """"folder" (a diffusers VAE folder) or "single_file" (one .safetensors VAE) for ``model.vae``; one line for a
    path that is neither, or a pickled file (unpickling runs code)."""
    if path.is_dir():
        if not os.path.lexists(path / "config.json"):  # (one that is no file: check_folder's line)
            raise UserError(VAE_KEY, f"{path}/ has no config.json: not a diffusers VAE folder",
                            "a diffusers VAE folder (config.json + weights) or a .safetensors VAE file")
        check_folder(path, VAE_KEY, "a diffusers VAE folder, its files as diffusers writes them")
        return "folder"
    safetensors_file(path, VAE_KEY, "a diffusers VAE folder or a .safetensors VAE file", "pickled VAEs",
                     "a .safetensors VAE file (convert a .pt first)")
    return "single_file"


def vae_files(path: Path) -> list[Path]:
    """The files ``model.vae``'s weights are read from: the file itself, or a folder's Flax file, its safetensors,
    or the shards its index lists (each a file beside the index)."""
    if vae_kind(path) == "single_file":
        return [path]
    for name in (VAE_FLAX, VAE_SAFETENSORS):
        if (path / name).is_file():
            return [path / name]
    index = path / f"{VAE_SAFETENSORS}.index.json"
    if not index.is_file():
        raise UserError(VAE_KEY, f"{path}/ has no {VAE_SAFETENSORS} (nor {VAE_FLAX}, nor shards with their index)",
                        "a diffusers VAE folder with its weights")
    files = read_index(index, VAE_KEY, "a diffusers VAE folder with its weights")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise UserError(VAE_KEY, f"{index} lists {missing[0]}, which is missing", "every shard its index lists")
    return files


EMBEDDINGS_KEY = "prompts.embeddings"


def embedding_files(paths) -> list[Path]:
    """The textual-inversion files ``prompts.embeddings`` names: each .safetensors file, and every .safetensors file
    under each folder (recursively, in name order); a named pickle (.pt, .bin) or a missing path is one line."""
    files: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.safetensors") if p.is_file()))
            continue
        safetensors_file(path, EMBEDDINGS_KEY, "textual-inversion .safetensors files or folders",
                         "pickled embeddings", "a .safetensors embedding (convert it first)")
        files.append(path)
    return files


# --- what a flow model's single-file checkpoint holds besides its transformer ------------------------------

# SD 3's components a file may hold besides the MMDiT: component -> its tensors' prefix (models/sd3/single_file.py
# reads them from there).
SD3_INSIDE = {"text_encoder": "text_encoders.clip_l.transformer.", "text_encoder_2": "text_encoders.clip_g.transformer.",
              "text_encoder_3": "text_encoders.t5xxl.transformer.", "vae": "first_stage_model."}
# The tensor that says a component is there (diffusers' is_clip_sd3_model, is_open_clip_sd3_model,
# is_t5_in_single_file; any first_stage_model tensor for the VAE).
SD3_MARKERS = {"text_encoder": "text_encoders.clip_l.transformer.text_model.embeddings.position_embedding.weight",
               "text_encoder_2": "text_encoders.clip_g.transformer.text_model.embeddings.position_embedding.weight",
               "text_encoder_3": "text_encoders.t5xxl.transformer.shared.weight"}


def sd3_components_inside(keys) -> tuple[str, ...]:
    """The components besides the transformer whose weights an SD 3 file holds, in :data:`SD3_INSIDE`'s order."""
    names = set(keys)
    found = [name for name, marker in SD3_MARKERS.items() if marker in names]
    if any(key.startswith(SD3_INSIDE["vae"]) for key in names):
        found.append("vae")
    return tuple(name for name in SD3_INSIDE if name in found)
