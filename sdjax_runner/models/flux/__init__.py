"""FLUX.1 (issue #46): the runner's own flax.linen twins of diffusers 0.39's PyTorch FLUX modules -- the
transformer (:mod:`.transformer`), the 16-channel VAE (:mod:`.autoencoder`) -- and the torch-free conversion of
diffusers' PyTorch safetensors to their parameters (:mod:`.convert`). diffusers has FLUX only in PyTorch; these
match its ``FluxTransformer2DModel`` and ``AutoencoderKL`` number for number (tests/test_flux_modules.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config_fields(config: Mapping[str, Any], defaults: Mapping[str, Any], what: str,
                  tuples: tuple[str, ...] = ()) -> dict[str, Any]:
    """A diffusers ``config.json``'s values for a module's fields: ``_``-prefixed keys (diffusers' bookkeeping)
    ignored, any other key not in ``defaults`` refused (ValueError: it could change the model), lists of the
    keys in ``tuples`` made tuples (module fields are hashable)."""
    unknown = sorted(k for k in config if not k.startswith("_") and k not in defaults)
    if unknown:
        raise ValueError(f"{what} config has unknown key(s) {', '.join(unknown)}")
    values = {k: config[k] for k in defaults if k in config}
    for key in tuples:
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return values
