"""How the SD family is read from disk: its loader (:mod:`.loading`), models/loaders.py's entry for it."""

from __future__ import annotations

from sdjax_runner.families.sd.models.loading import load_sd, read_vae_folder, vae_from_state
from sdjax_runner.models.family_loader import FamilyLoader

LOADER = FamilyLoader(load_sd, read_vae_folder, vae_from_state)
