"""Where a sampler starts, and what steers it: what each mode (engine/modes/) hands the sampler."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional


class Start(NamedTuple):
    noise: Any  # (batch, 4, h, w) standard normal, float32
    image: Optional[Any] = None  # the init image's latents (scaled by the VAE's scaling factor)
    step: Any = 0  # the step the sampler starts at: 0, or a traced int32
    keep: Optional[Any] = None  # (batch, 1, h, w): 1 where the init image is kept (ordinary-model inpainting)
    # Fields for the Conditioning (engine/encode.py): concat, control. Read only; a NamedTuple has no
    # default_factory, and a plain dict keeps Start a plain pytree.
    conditioning: dict = {}  # noqa: RUF012 -- never mutated (see above)
    # Start from pure noise at step 0 (inpainting at strength 1, as diffusers' inpaint pipelines do), rather
    # than from the image noised to the first step's level (img2img at strength 1, as its pipelines do).
    pure_at_zero: bool = False


def kept(start: Start, image, x):
    """``x`` with ``image`` where ``start.keep`` is 1 (ordinary-model inpainting's blend)."""
    assert start.keep is not None  # called only for a start that keeps part of the image
    return start.keep * image + (1 - start.keep) * x


def initial(start: Start, pure, noised):
    """The sampler's first sample: ``pure`` (the noise at the first level) from pure noise, else
    ``noised(step)`` (the init image noised to step ``step``'s level)."""
    if start.image is None:
        return pure
    if start.pure_at_zero:
        import jax.numpy as jnp

        return jnp.where(start.step == 0, pure, noised(start.step))
    return noised(start.step)
