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
    architecture: str  # its family's name for it: "sd1", "sd2", "sdxl", "flux-dev", "sd3.5-large" ...
    keys: tuple[str, ...]
    # From the base model's configs (see on_base): how LDM's flat layer numbers map to diffusers' blocks.
    layers_per_block: int = 2
    vae_levels: int = 4
    family: str = ""  # the model family whose entry knew the file (config/families.open_checkpoint)
    title: str = ""  # what the architecture is called ("SD 1.x", "FLUX.1 [dev]")
    base: str = ""  # the hub id of its standard base model: configs, tokenizers and scheduler when none is given


@dataclass(frozen=True)
class Architecture:
    """A single-file checkpoint's architecture as its family's entry names it (FamilyEntry.single_files)."""

    title: str  # "SD 1.x"
    base: str  # the standard base model's hub id (configs, tokenizers, scheduler): "stable-diffusion-v1-5/..."


def safetensors_file(path: Path, key: str, wanted: str, pickled: str, allowed: str) -> None:
    """One line naming ``key`` for a ``path`` that is no file (``wanted``: what it should be) or no .safetensors
    file: ``pickled`` files (say "pickled VAEs") can run code when loaded and are not read."""
    missing = not_a_file(path)
    if missing:
        raise UserError(key, f"{missing}: {path}", wanted)
    if path.suffix != ".safetensors":
        raise UserError(key, f"{path.name} is not a .safetensors file; {pickled} (.ckpt, .pt, .bin) can run code when "
                        "loaded and are not read", allowed)


COMFY_PREFIX = "model.diffusion_model."  # before a transformer's names in ComfyUI's saves of BFL-layout files


def without_comfy_prefix(names) -> dict[str, str]:
    """{a BFL-layout transformer's tensor name: the file's name}: ComfyUI's prefix taken off where its double blocks
    carry it (the other tensors of such a file -- text encoders, a VAE -- are left out), else every name as it is."""
    if any(name.startswith(COMFY_PREFIX + "double_blocks.") for name in names):
        return {name[len(COMFY_PREFIX):]: name for name in names if name.startswith(COMFY_PREFIX)}
    return {name: name for name in names}


def checkpoint_keys(path: Path) -> tuple[str, ...]:
    """A single-file checkpoint's tensor names, from its header alone (milliseconds); which family's file it is,
    config/families.open_checkpoint asks each family's entry."""
    safetensors_file(path, KEY, "a single-file .safetensors checkpoint", "pickle checkpoints",
                     "a .safetensors checkpoint (convert a .ckpt first)")
    return safetensors_keys(path, KEY, f"{path.name}:", "a single-file .safetensors checkpoint")


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
