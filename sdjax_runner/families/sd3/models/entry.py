"""How SD 3 / 3.5 is read from disk: its loader (:mod:`.pipeline`), models/loaders.py's entry for it. Its VAE
is FLUX.1's module (16 latent channels, no quant convs), read alike."""

from __future__ import annotations

from sdjax_runner.families.flux.models.pipeline import read_vae_folder, vae_from_state
from sdjax_runner.families.sd3.models.pipeline import load_sd3
from sdjax_runner.models.family_loader import FamilyLoader

LOADER = FamilyLoader(load_sd3, read_vae_folder, vae_from_state)
