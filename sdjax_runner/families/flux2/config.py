"""What the config knows of FLUX.2 [klein] (config/families.py's entry for it): diffusers' Flux2KleinPipeline's defaults,
its built-in models, and the settings it has no use for (yet), each refused in one line. Whether a model guides (a base
[klein]) or not (a distilled one) its folder's index says; the engine checks it once the model is loaded
(families/flux2/engine/family.check_loaded)."""

from __future__ import annotations

from typing import Any, Optional

from sdjax_runner.config import guiders, samplers
from sdjax_runner.config.family_entry import FamilyEntry, read_as_written
from sdjax_runner.config.modes import flow_start_step
from sdjax_runner.config.weight_files import COMFY_PREFIX, Architecture, without_comfy_prefix
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.config import flow_inpaint

# A FLUX.2 transformer as one file in Black Forest Labs' layout (the hub's flux-2-klein-4b.safetensors, ComfyUI's saves);
# the rest of the pipeline from the base folder (null: the distilled klein repository of its size: 9B's by its blocks)
SINGLE_FILES = {"flux2-klein": Architecture("FLUX.2 [klein]", "black-forest-labs/FLUX.2-klein-4B"),
                "flux2-klein-9b": Architecture("FLUX.2 [klein] 9B", "black-forest-labs/FLUX.2-klein-9B")}
KLEIN_9B = (8, 24)  # its (double, single) blocks
DEV_SINGLE_BLOCKS = 48  # FLUX.2 [dev]'s single blocks (its text encoder is Mistral's: not run)


MARKER = "single_stream_modulation.lin.weight"  # diffusers' CHECKPOINT_KEY_NAMES["flux2"]: FLUX.2's alone


def is_flux2(names) -> bool:
    """Whether a single file's tensor names are a FLUX.2 transformer's in BFL's layout."""
    return any(name in (MARKER, COMFY_PREFIX + MARKER) for name in names)


def blocks(names, kind: str) -> int:
    """How many blocks of ``kind`` (double_blocks: 5 in klein 4B, 8 in 9B; single_blocks: 20, 24) the file's
    transformer has."""
    return len({name.split(".")[1] for name in without_comfy_prefix(names) if name.startswith(kind + ".")})



def architecture_of(keys: frozenset[str], name: str = "") -> Optional[str]:
    """"flux2-klein-9b" for a FLUX.2 transformer in BFL's layout (families/flux2/models/single_file.py: its shared
    single-stream modulation) of klein 9B's blocks, "flux2-klein" for another klein's (4B's, or one of a base folder's
    own shape); FLUX.2 [dev]'s is one line; else None."""
    if not is_flux2(keys):
        return None
    counts = (blocks(keys, "double_blocks"), blocks(keys, "single_blocks"))
    if counts[1] == DEV_SINGLE_BLOCKS:
        raise UserError("model.checkpoint", f"{name}: a FLUX.2 [dev] transformer ({counts[0]} double, {counts[1]} single "
                        "blocks), whose Mistral text encoder is not run yet", "a FLUX.2 [klein] transformer file")
    return "flux2-klein-9b" if counts == KLEIN_9B else "flux2-klein"


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
                    scheduler_settings=False, short="FLUX.2", single_files=SINGLE_FILES,
                    architecture_of=architecture_of, checkpoint_holds=lambda keys: ("transformer",))
