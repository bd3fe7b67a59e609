"""Stage 2, prepare: the modes. Each maps (pipeline, params, key, spec, batch, inputs) -> a :class:`.start.Start`:
the initial noise, and what the sampler starts from and is steered by -- an init image's latents and the
step to start at (img2img, inpaint), a mask (inpaint), extra UNet input channels (inpainting models) or a
ControlNet's inputs (added to the conditioning, :class:`~sdjax_runner.engine.encode.Conditioning`).
``inputs`` holds the mode's traced inputs (engine/generate.py places them): the per-image arrays ``init``,
``mask``, ``control`` and the numbers ``start`` (the start step, from strength) and ``control_scale`` --
inputs, not part of the program, so sweeping strength or the conditioning scale never recompiles.

How a sampler uses a Start (engine/samplers): from pure noise it scales ``noise`` to its first noise level;
given ``image`` it noises the image to the level of step ``step`` and runs from there; given ``keep`` it
puts the init image back, noised to the current level, wherever ``keep`` is 1 (inpainting with an ordinary
model). A new mode is a module here, a line in :data:`MODES` and its entry in config/modes.py's ``MODES`` (the
images and numbers it takes, its checks), which this registry is checked against."""

from __future__ import annotations

from sdjax_runner.config.modes import MODES as ENTRIES
from sdjax_runner.engine.modes import controlnet, img2img, inpaint, txt2img

# The SD family's modes (the flow families' are their stages': families/<name>/engine/entry.py)
MODES = {"txt2img": txt2img.prepare, "img2img": img2img.prepare, "inpaint": inpaint.prepare,
         "controlnet": controlnet.prepare}
if not set(MODES) <= set(ENTRIES):
    raise RuntimeError(f"engine/modes runs {tuple(MODES)}, config/modes.py lists {tuple(ENTRIES)}")
# The traced inputs each mode takes: per-image arrays (sharded with the batch) and numbers (replicated).
PER_IMAGE = {name: entry.per_image for name, entry in ENTRIES.items()}
NUMBERS = {name: entry.numbers for name, entry in ENTRIES.items()}
