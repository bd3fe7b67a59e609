"""Another VAE for a loaded model (``model.vae``), torch-free, as A1111's "SD VAE" setting and diffusers'
``vae=AutoencoderKL.from_pretrained(...)`` swap it:

* a diffusers VAE folder (``config.json`` and ``diffusion_pytorch_model.safetensors``, or diffusers' Flax
  ``diffusion_flax_model.msgpack``): its own module, from its own config (madebyollin/sdxl-vae-fp16-fix: no
  upcast in float16), checked against the model's latent channels and down-sampling;
* one ``.safetensors`` file in the original (LDM) layout (``vae-ft-mse-840000-ema-pruned.safetensors``,
  ``sdxl_vae.safetensors``, FLUX.1's ``ae.safetensors``; bare ``encoder.*`` / ``decoder.*`` names or a
  checkpoint's ``first_stage_model.*``): the model's own VAE config with these weights (models/single_file.py's
  renaming), as A1111 loads one.

Pickled files (``.pt``, ``.ckpt``, ``.bin``) are refused before anything is read: unpickling runs code. The engine
keeps the model and swaps only this component (engine/reuse.py), so a sweep over VAEs loads the model once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.schema import DtypeConfig
from sdjax_runner.config.weight_files import VAE_KEY, vae_kind
from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError
from sdjax_runner.models.checkpoints import WeightsMismatch

KEY = VAE_KEY


@dataclass(frozen=True)
class SwappedVae:
    """A VAE to run instead of the model's: its module (the model's own for a single file), host weights and how
    they were stored ("folder" or "single_file")."""

    module: Any
    params: dict
    format: str


def load_vae(path: Path, base_module: Any, family: str, model_path: str, dtype: DtypeConfig,
             expected_sha256: Optional[str] = None) -> SwappedVae:
    """``path`` (config/weight_files.vae_kind) read for a model of ``family`` at ``model_path`` whose own VAE is
    ``base_module``, in ``dtype``; refused once read if its weights no longer have the planned hash."""
    import jax.numpy as jnp

    from sdjax_runner.models import loading

    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = loading.numpy_dtype(dtype.weights_dtype.name)
    try:
        if vae_kind(path) == "folder":
            check_fits(path, _config(base_module), _folder_config(path))
            swapped = _folder(path, family, base_module, activations, weights)
        else:
            swapped = _single_file(path, family, base_module, activations, weights)
    except UserError as exc:
        if exc.key == KEY:
            raise
        raise UserError(KEY, f"{path}: {exc.problem}", exc.allowed) from None
    except WeightsMismatch as exc:
        raise UserError(KEY, f"does not fit {model_path}'s VAE: {error_line(exc, 300)}",
                        "a VAE of the model's architecture (SD 1.x/2.x: 4 latent channels; SDXL: its own; FLUX.1 and "
                        "SD 3: 16)") from None
    except Exception as exc:  # the file is input: one line, never a traceback
        raise UserError(KEY, f"{path}: cannot be loaded ({type(exc).__name__}: {error_line(exc, 200)})",
                        "a diffusers VAE folder or a .safetensors VAE file") from None
    from sdjax_runner.config.plan import vae_sha256

    if expected_sha256 is not None and vae_sha256(path) != expected_sha256:
        raise UserError(KEY, f"{path} changed since the run was planned; it is not run under the old hash",
                        "run again")
    return swapped


def _single_file(path: Path, family: str, module: Any, activations: Any, weights: np.dtype) -> SwappedVae:
    """The model's own VAE module with the file's weights (LDM names, bare or under first_stage_model.), converted
    by its family's rule (models/loaders.py)."""
    from sdjax_runner.models.loaders import LOADERS
    from sdjax_runner.models.single_file import vae_tensors
    from sdjax_runner.tensor_files import read_safetensors

    tensors = read_safetensors(path)
    prefix = "first_stage_model." if any(key.startswith("first_stage_model.") for key in tensors) else ""
    levels = len(_config(module)["block_out_channels"])
    state = vae_tensors(tensors, prefix, levels, path.name)
    vae_weights = np.dtype(np.float32) if module.dtype != activations else weights
    return SwappedVae(module, LOADERS[family].vae_from_state(module, state, vae_weights, path.name), "single_file")


def _folder(path: Path, family: str, base_module: Any, activations: Any, weights: np.dtype) -> SwappedVae:
    """A diffusers VAE folder: its own module from its config.json, in the dtype its config asks for, read by its
    family's rule (models/loaders.py)."""
    from sdjax_runner.models import loading
    from sdjax_runner.models.loaders import LOADERS

    vae_dtype = loading.component_dtype(path.parent, path.name, activations)
    vae_weights = np.dtype(np.float32) if vae_dtype != activations else weights
    module, params = LOADERS[family].read_vae_folder(path, vae_dtype, vae_weights)
    return SwappedVae(module, params, "folder")


def check_fits(path: Path, ours: dict, theirs: dict) -> None:
    """A VAE folder's config (``theirs``) makes the model's latents (``ours``: its VAE's config): the same latent
    channels and resolution levels (one line otherwise)."""
    for key in ("latent_channels", "block_out_channels"):
        mine, other = ours.get(key), theirs.get(key)
        if key == "block_out_channels":
            mine, other = len(mine or ()), len(other or ())
        if mine != other:
            what = "latent channels" if key == "latent_channels" else "resolution levels (its down-sampling)"
            raise UserError(KEY, f"{path.name} has {other} {what}, the model's VAE {mine}",
                            "a VAE of the model's architecture")


def _folder_config(path: Path) -> dict:
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(KEY, f"{path / 'config.json'} cannot be read as JSON ({type(exc).__name__})",
                        "a diffusers VAE config") from None
    if not isinstance(config, dict):
        raise UserError(KEY, f"{path / 'config.json'} is not a JSON object", "a diffusers VAE config")
    return config


def _config(module: Any) -> dict:
    config = getattr(module, "config", None)
    if config is not None:
        return dict(config)
    return {name: getattr(module, name) for name in ("latent_channels", "block_out_channels")}
