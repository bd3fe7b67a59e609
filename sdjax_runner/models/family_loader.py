"""How one model family is read from disk (:class:`FamilyLoader`). Each family's package makes its own
(``families/<name>/models/entry.py``'s ``LOADER``); models/loaders.py gathers them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.models.loading import LoadedModel


@dataclass(frozen=True)
class FamilyLoader:
    """How one model family (config/families.py) is read from disk."""

    # (folder, its model_index.json, model config, dtype, opened single-file checkpoint or None, its planned hash)
    # -> LoadedModel
    load: Callable[..., LoadedModel]
    # (a diffusers VAE folder, the activations dtype, the weights' NumPy dtype) -> (module, host weights): another
    # VAE for a loaded model, as a folder (model.vae: models/vae_swap.py)
    read_vae_folder: Callable[[Path, Any, np.dtype], tuple[Any, dict]]
    # (the model's own VAE module, a single file's tensors under diffusers' names, the weights' dtype, the file's
    # name) -> host weights: another VAE as one file
    vae_from_state: Callable[[Any, dict, np.dtype, str], dict]
    # (a LoRA's modules, the transformer's params, the file's name, config key) -> the modules under the transformer's
    # own names: the family's LoRAs in its original layout (kohya's, ai-toolkit's BFL names: models/lora.read); None:
    # its LoRAs name the modules as the runner's modules do (diffusers', PEFT's)
    lora_modules: Optional[Callable[[dict, dict, str, str], dict]] = None
