"""SDXL's refiner inside the program (config/refiner.py says when it switches; models/refiner.py loads it).

The refiner takes over from the base within the one sampling loop: every UNet call whose timestep is below the cutoff
runs the refiner's UNet on the refiner's conditioning instead of the base's (``lax.cond`` per call,
engine/samplers/unet.py). That is diffusers' ensemble of experts -- the base's loop stops at the cutoff and the
refiner's continues from its latents, no noise added, on the same schedule -- for the schedulers that keep no state
across steps (Euler, Euler a, DDIM, ...), and A1111's refiner, which swaps the model between two denoiser calls of one
sampler. The scheduler's or sampler's state runs on across the switch, as in A1111 (diffusers restarts a multistep
scheduler's history at the refiner: DPM-Solver++, PNDM, LMS differ there).

The refiner's conditioning, as diffusers' ``StableDiffusionXLImg2ImgPipeline`` with the refiner's
``requires_aesthetics_score`` and ``force_zeros_for_empty_prompt`` false builds it: its second text encoder's
penultimate hidden states and pooled projection of the base's second-tokenizer ids (the tokenizers are one,
models/refiner.py checks), an absent negative prompt encoded as the empty one, and the time ids ``(height, width, 0,
0, 6.0)`` for the prompt and ``(height, width, 0, 0, 2.5)`` for the negative (its aesthetic scores; A1111's defaults
too), or the base's six size ids for a refiner without aesthetic scores."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import Any

import jax.numpy as jnp
import numpy as np

from sdjax_runner.engine.encode import Conditioning, embedded, read_chunks

log = logging.getLogger("sdjax_runner")

AESTHETIC_SCORE = 6.0  # diffusers' aesthetic_score, A1111's sdxl_refiner_high_aesthetic_score
NEGATIVE_AESTHETIC_SCORE = 2.5  # negative_aesthetic_score, A1111's sdxl_refiner_low_aesthetic_score


@dataclass(frozen=True)
class RefinerPass:
    """What shapes the refiner's part of a program (a :class:`~.program.Spec` field). Its switch does not: the cutoff
    timestep is a traced input (``inputs["refiner_cutoff"]``, :func:`cutoff`), so a sweep over
    ``sampling.refiner_switch`` compiles once."""

    aesthetic: bool  # 5 time ids with aesthetic scores, else the base's 6 size ids
    structure: str  # its modules' configs (models/refiner.LoadedRefiner.structure)


def refiner_pass(refiner: Any, structure: str):
    """The plan's refiner (config/refiner.Refiner, or None) as the program's shape."""
    return None if refiner is None else RefinerPass(refiner.aesthetic, structure)


def cutoff(refiner: Any, pipeline: Any) -> int:
    """The timestep below which the refiner (config/refiner.Refiner) runs, on the loaded ``pipeline``'s training
    schedule (its length)."""
    return refiner.cutoff(int(pipeline.scheduler.config.num_train_timesteps))


def lowest_timestep(pipeline: Any, sampler: str, sigmas: str, steps: int) -> int:
    """The training timestep the last step of a ``steps``-step schedule runs at, as the refiner's switch reads it:
    the scheduler's last timestep (``sampler`` "scheduler"), else the training timestep whose sigma is nearest k
    sampler ``sampler``'s last nonzero sigma on schedule ``sigmas`` (A1111's apply_refiner)."""
    if sampler == "scheduler":
        scheduler = pipeline.scheduler
        state = scheduler.set_timesteps(scheduler.create_state(), num_inference_steps=steps, shape=(1, 4, 8, 8))
        return int(np.min(np.asarray(state.timesteps)))
    from sdjax_runner.engine.samplers.k_model import step_sigmas
    from sdjax_runner.engine.samplers.sigmas import training_sigmas

    training = training_sigmas(pipeline.scheduler.config)
    last = step_sigmas(sampler, sigmas, steps, training)[-2]
    return int(np.argmin(np.abs(training - last)))


def say_unused_refiner(pipeline: Any, spec: Any, refiner: Any) -> None:
    """One line where the refiner (config/refiner.Refiner, or None) runs on no step: even the last step's timestep
    (the lowest the pass reaches) is at or above its cutoff -- ``sampling.refiner_switch`` past the last step. The
    pass it runs in is Hires. fix's second where that runs, else the one pass."""
    if refiner is None:
        return
    sampler, sigmas, steps = spec.sampler, spec.sigmas, spec.steps
    if spec.hires:
        sampler, sigmas, steps = (spec.hires.sampler or sampler, spec.hires.sigmas or sigmas, spec.hires.schedule)
    lowest, below = lowest_timestep(pipeline, sampler, sigmas, steps), cutoff(refiner, pipeline)
    if lowest >= below:
        log.warning("sampling.refiner_switch: %g hands over at timestep %d, and the last of the %d steps runs at %d: "
                    "the refiner runs on no step, the images are the base's alone (lower sampling.refiner_switch)",
                    refiner.switch, below, steps, lowest)


def with_refiner(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict, first: Conditioning,
                 second: Conditioning) -> tuple[Conditioning, Conditioning]:
    """(``first``, ``second``) -- the conditioning of the program's pass and of Hires. fix's second pass (the first's
    without one) -- with the refiner's attached: to the second pass alone where Hires. fix runs, at its size (A1111's
    default, "Hires fix: which pass to enable refiner for": second pass), else to the one pass."""
    if spec.hires:
        sized = replace(spec, height=spec.hires.height, width=spec.hires.width)
        return first, second._replace(refiner=(conditioning(pipeline, params, ids, negative_ids, sized, inputs),
                                               inputs["refiner_cutoff"]))
    attached = first._replace(refiner=(conditioning(pipeline, params, ids, negative_ids, spec, inputs),
                                       inputs["refiner_cutoff"]))
    return attached, attached


def conditioning(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict) -> Conditioning:
    """The refiner's conditioning, unconditional half first, for the base's prompt ids ((rows, 2, tokens): the
    second tokenizer's are read), read as the base reads them (A1111's chunks and emphasis: ``inputs``' token
    weights); ``negative_ids`` None (the base's zeros): the empty prompt's ids, ``inputs["refiner_negative_ids"]``."""
    refiner = pipeline.refiner

    @functools.partial(embedded, pipeline, params, "text_encoder_2")
    def second(rows):
        out = refiner.text_encoder_2.apply({"params": params["refiner"]["text_encoder_2"]}, rows,
                                           output_hidden_states=True)
        return out.hidden_states[-2], out.text_embeds

    def read(rows, weights):
        return read_chunks(second, rows[:, 1], spec.prompt_chunks, None if weights is None else weights[:, 1])

    context, pooled = read(ids, inputs.get("prompt_weights"))
    if negative_ids is None:
        negative_ids, negative_weights = inputs["refiner_negative_ids"], inputs.get("refiner_negative_weights")
    else:
        negative_weights = inputs.get("negative_weights")
    negative_context, negative_pooled = read(negative_ids, negative_weights)
    rows = ids.shape[0]
    if spec.refiner.aesthetic:
        size = [spec.height, spec.width, 0, 0]
        time_ids = [[*size, NEGATIVE_AESTHETIC_SCORE]] * rows + [[*size, AESTHETIC_SCORE]] * rows
    else:
        time_ids = [[spec.height, spec.width, 0, 0, spec.height, spec.width]] * (2 * rows)
    return Conditioning(jnp.concatenate([negative_context, context]),
                        {"text_embeds": jnp.concatenate([negative_pooled, pooled]),
                         "time_ids": jnp.array(time_ids, dtype=context.dtype)})
