"""How FLUX.1 is read from disk: its loader (:mod:`.pipeline`), models/loaders.py's entry for it."""

from __future__ import annotations

from sdjax_runner.families.flux.models.lora_names import kohya_modules
from sdjax_runner.families.flux.models.pipeline import load_flux, read_vae_folder, vae_from_state
from sdjax_runner.models.family_loader import FamilyLoader

LOADER = FamilyLoader(load_flux, read_vae_folder, vae_from_state, lora_modules=kohya_modules)
