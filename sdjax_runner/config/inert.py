"""Settings that act on nothing in a run, said in one line each and left out of what runs and what is recorded.

Round five of the newcomer trials: the docs' own skip-layer-guidance example (``+experiment=sd3_smoke
'sampling.slg_layers=[1]'``, today ``guider=skip_layer 'guider.layers=[1]'``) runs 4 steps, and the default window
(0.01..0.2 of the steps) holds none of them -- the images were the plain run's bit for bit, while images.json said ``slg_layers: 1, slg_scale: 2.8`` and the FLOPs
counted an extra transformer call. A setting like that now logs what it acts on (nothing, and why), and the plan
runs and records the run without it: the record says what ran.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from sdjax_runner.config.guiders import DEFAULT as GUIDER_DEFAULT
from sdjax_runner.config.guiders import GUIDERS, Guider
from sdjax_runner.config.modes import outside_control_window

log = logging.getLogger("sdjax_runner")


def skip_layer_steps(steps: int, start: float, stop: float) -> list[int]:
    """The steps skip-layer guidance acts on: diffusers' ``start * steps < i < stop * steps``."""
    return [i for i in range(steps) if steps * start < i < steps * stop]


def acting_skip_layer(guider: Guider, steps: int, guidance: float) -> Guider:
    """A skip-layer guider as it acts: where it acts on no step, classifier-free guidance (its window kept), with a
    line saying why."""
    if not GUIDERS[guider.name].skips:
        return guider
    settings = dict(guider.settings)
    start, stop = settings["skip_start"], settings["skip_stop"]
    if guidance <= 1:
        why = f"it adds to classifier-free guidance, and sampling.guidance_scale is {guidance:g} (no CFG)"
    elif not skip_layer_steps(steps, start, stop):
        why = (f"its window {start:g}..{stop:g} of the {steps} steps (diffusers' start * steps < step < stop * steps) "
               "holds none of them")
    else:
        return guider
    log.warning("guider=skip_layer: blocks %s act on no step of this run: %s; run and recorded as guider=cfg (widen "
                "guider.skip_start/skip_stop or run more steps)", [int(layer) for layer in guider.layers], why)
    return dataclasses.replace(guider, name=GUIDER_DEFAULT, settings=(), layers=())


def acting_rescale(rescale: Optional[float], guidance: float, true_cfg: Optional[float] = None) -> Optional[float]:
    """CFG rescale as it acts: None (with a line) where no classifier-free guidance runs for it to rescale."""
    if rescale is None or guidance > 1:
        return rescale
    log.warning("sampling.guidance_rescale: %g rescales classifier-free guidance, and sampling.guidance_scale is %g "
                "(no CFG); run and recorded without it", rescale, guidance)
    return None


def used_embeddings(embeddings: tuple[Any, ...], texts: list[str], negative: Optional[str]) -> tuple[Any, ...]:
    """``embeddings`` (the plan's records), each named by no prompt (nor the negative) said in one line: they are
    loaded (a sweep's other points may call them) and listed as given, but they change no image."""
    words = " ".join([*texts, negative or ""])
    unused = [entry.name for entry in embeddings if entry.name not in words]
    if unused:
        log.warning("prompts.embeddings: %s named by no prompt: used by none, the images are as without them (a "
                    "prompt calls one by its file name, e.g. %r)", ", ".join(unused), unused[0])
    return embeddings


def zero_scale_adapters(adapters: tuple[Any, ...]) -> None:
    """A LoRA at scale 0 merges nothing: said (a scale sweep's 0 is the baseline, on purpose -- still said once)."""
    for index, adapter in enumerate(adapters):
        if adapter.scale == 0:
            log.warning("lora.%d.scale: 0 -- %s merges nothing at scale 0; the images are the model's own", index,
                        adapter.path)


def same_size_hires(scale: Optional[float]) -> None:
    """Hires. fix at scale 1 upscales nothing: A1111 still runs the second pass, an img2img of the first pass at its
    own size -- said, since the name promises a larger image."""
    if scale == 1:
        log.warning("sampling.hires.scale: 1 upscales nothing: the second pass denoises the first pass's image again "
                    "at the same size (as A1111 does); a larger image needs a scale over 1")


def control_window_steps(steps: int, start: float, end: float) -> list[int]:
    """The steps a ControlNet steers (config/modes.outside_control_window: diffusers' ``controlnet_keep``)."""
    return [i for i in range(steps) if not outside_control_window(i, steps, start, end)]


def said_control_window(steered: bool, mode: str, steps: int, start: float, end: float) -> None:
    """controlnet.guidance_start/end set where no ControlNet runs, or a window that holds none of the run's steps:
    one line each (the run is as it is -- the window is a traced input a sweep's other points may need -- and its
    images are those of no ControlNet)."""
    if (start, end) == (0.0, 1.0):
        return
    if not steered:
        log.warning("controlnet.guidance_start/guidance_end: set, but mode=%s runs no ControlNet", mode)
    elif not control_window_steps(steps, start, end):
        log.warning("controlnet.guidance_start/guidance_end: the window %g..%g of the %d steps (diffusers' start <= "
                    "step / steps and (step + 1) / steps <= end) holds none of them: the ControlNet steers no step "
                    "(widen the window or run more steps)", start, end, steps)
