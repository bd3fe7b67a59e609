"""What the config knows of FLUX.2 [klein] (config/families.py's entry for it): diffusers' Flux2KleinPipeline's defaults,
its built-in models, and the settings it has no use for (yet), each refused in one line. Whether a model guides (a base
[klein]) or not (a distilled one) its folder's index says; the engine checks it once the model is loaded
(families/flux2/engine/family.check_loaded)."""

from __future__ import annotations

from typing import Any

from sdjax_runner.config import guiders, samplers
from sdjax_runner.config.family_entry import FamilyEntry, read_as_written
from sdjax_runner.config.modes import flow_start_step
from sdjax_runner.families.flux.config import flow_inpaint


def _flux2_values(config: Any) -> None:
    """Settings FLUX.2 has no use for, each refused in one line rather than ignored."""
    flow_inpaint(config, "FLUX.2")
    read_as_written(config, "FLUX.2", "FLUX.2 reads three of Qwen3's hidden layers (9, 18, 27), which no clip skip "
                    "changes")


# diffusers' Flux2KleinPipeline defaults: 50 steps, guidance 4.0 (a base model's; a distilled one reads none), 512
# tokens of chat text per prompt.
ENTRY = FamilyEntry("flux2", "FLUX.2 [klein]: a Qwen3 text encoder, a flow-matching transformer, a 32-channel VAE",
                    ("Flux2KleinPipeline",), tiny="tiny-random-flux2", modes=("txt2img", "edit", "inpaint"),
                    start_step=flow_start_step,
                    builtins=("tiny-random-flux2", "tiny-random-flux2-base", "flux2-klein-4b-arch",
                              "flux2-klein-9b-arch"),
                    steps=50, guidance=4.0, check=_flux2_values, sampling=samplers.resolve_flow, t5_tokens=512,
                    a1111_prompts=False, guiders=guiders.COMBINING, reference_images=True, sampler_names_scheduler=True,
                    scheduler_settings=False, short="FLUX.2")
