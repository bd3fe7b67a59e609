"""Stage 2, prepare: the modes. Each maps (pipeline, params, key, spec, batch) -> the initial latents
(batch, channels, height / 8, width / 8) the sampler starts from. A new mode (img2img, inpaint, ...) is a
module here and an entry in :data:`MODES`."""

from __future__ import annotations

from sdjax_runner.engine.modes import txt2img

MODES = {"txt2img": txt2img.initial_latents}
