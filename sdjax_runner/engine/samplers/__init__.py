"""Stage 3, denoise: the samplers. Each maps (pipeline, params, conditioning, initial latents, guidance,
spec) -> the final latents, inside the traced program (a ``lax.fori_loop``, no host loop per step). A new
sampler is a module here and an entry in :data:`SAMPLERS`."""

from __future__ import annotations

from sdjax_runner.engine.samplers import schedulers

SAMPLERS = {"scheduler": schedulers.denoise}
