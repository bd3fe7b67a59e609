"""How FLUX.2 [klein] is read from disk: its loader (:mod:`.pipeline`), models/loaders.py's entry for it."""

from __future__ import annotations

from sdjax_runner.families.flux2.models.lora_names import bfl_modules
from sdjax_runner.families.flux2.models.pipeline import load_flux2, read_vae_folder, vae_from_state
from sdjax_runner.models.family_loader import FamilyLoader

LOADER = FamilyLoader(load_flux2, read_vae_folder, vae_from_state, lora_modules=bfl_modules)
