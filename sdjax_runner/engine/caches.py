"""Step caches in the program (config/caches.py names them; a family's sampler runs the ones its entry lists):
how a cache's settings reach the program -- traced inputs named ``cache_`` + the setting (engine/generate.py
places them, engine/program.py hands them to the sampler in ``Guidance.cache``) -- and what a sampler that ran
one returns: :class:`Cached`, the latents and the denoiser calls it skipped on this device, which the program
returns beside the pixels (timings.json's ``denoiser_calls_skipped``)."""

from __future__ import annotations

from typing import Any, NamedTuple

CACHE_INPUT = "cache_"  # a cache's setting KEY is the program's traced input cache_KEY


class Cached(NamedTuple):
    """A sampler's result under a step cache."""

    latents: Any
    skipped: Any  # int32: the denoiser calls whose blocks after the first were skipped, on this device
