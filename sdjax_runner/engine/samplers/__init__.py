"""Stage 3, denoise: the samplers. Each maps (pipeline, params, conditioning, initial latents, guidance,
spec, key) -> the final latents, inside the traced program (a ``lax.fori_loop``, no host loop per step);
``key`` is the device's, for the samplers that add noise. A new k sampler is its function in k_samplers.py's
:data:`K_SAMPLERS` and its entry (names, eta, minimum steps, quirks) in config/samplers.py's ``SAMPLERS``, which
this registry is checked against."""

from __future__ import annotations

from sdjax_runner.config.samplers import K_SAMPLERS as NAMES
from sdjax_runner.engine.samplers import k_model, schedulers
from sdjax_runner.engine.samplers.k_samplers import K_SAMPLERS

if tuple(K_SAMPLERS) != NAMES:
    raise RuntimeError(f"engine/samplers runs {tuple(K_SAMPLERS)}, config/samplers.py lists {NAMES}")

SAMPLERS = {"scheduler": schedulers.denoise, **{name: k_model.sampler(name) for name in K_SAMPLERS}}
