"""Sharded batches -> images and timings: what both parallel modes share.

A parallel mode (:mod:`.pmap`, :mod:`.sharded`; :data:`.parallel.PARALLEL` picks one) is a
:class:`Generator` subclass that knows how to place the params and the inputs on devices and how to
lower the generation programs (:mod:`.program`: the sampling program, then the decoding program on its latents)
for them. Both give the same images for the same plan. Programs are compiled ahead of time so compilation is timed
apart from execution.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.caches import DEFAULT as CACHE_DEFAULT
from sdjax_runner.config.plan import Plan
from sdjax_runner.engine import efficiency
from sdjax_runner.engine.caches import CACHE_INPUT
from sdjax_runner.engine.families import FAMILIES
from sdjax_runner.engine.guiders import GUIDER_INPUT
from sdjax_runner.engine.modes import NUMBERS, PER_IMAGE
from sdjax_runner.engine.program import Spec
from sdjax_runner.engine.refiner import cutoff
from sdjax_runner.engine.tokens import PromptTokens


def batch_keys(seed: int, batch: int, num_devices: int) -> np.ndarray:
    """Per-device PRNG keys: the guide's split(PRNGKey(seed)) for batch 0, fold_in(batch) after."""
    import jax

    key = jax.random.PRNGKey(seed)
    if batch:
        key = jax.random.fold_in(key, batch)
    return np.asarray(jax.random.split(key, num_devices))


@dataclass
class Timings:
    first_batch_s: float = 0.0  # the first execution in this job, blocked
    # Later executions, each blocked: the run's batches after the first, then re-runs of batch 0.
    steady_s: list[float] = field(default_factory=list)
    extra_s: list[float] = field(default_factory=list)  # the re-runs among them (timed only, outputs discarded)
    # The job's seconds when its batches were done (load, compile, the batches and their writes): the re-runs'
    # cost is weighed against it (timing.max_extra_share); the batches' own seconds when the start is unknown.
    base_s: float = 0.0

    def summary(self, images_per_batch: int, steps: int) -> dict[str, Any]:
        """The steady state: the median (min, max) of the timed calls after the first; with none, the first
        call's own figure, said so (``steady_calls`` 0, ``generate_s_from`` "first_call"), never invented."""
        calls = self.steady_s or [self.first_batch_s]
        median = statistics.median(calls)
        return {
            "first_batch_s": self.first_batch_s,
            "generate_s": median,
            "generate_s_min": min(calls),
            "generate_s_max": max(calls),
            "steady_calls": len(self.steady_s),
            "generate_s_from": "steady_median" if self.steady_s else "first_call",
            "timing_base_s": self.base_s,
            "timing_extra_calls": len(self.extra_s),
            "timing_extra_s": sum(self.extra_s),
            "images_per_s": images_per_batch / median,
            "s_per_step": median / steps,
        }


def extra_call_affordable(extra_s: float, next_s: float, base_s: float, share: Optional[float]) -> bool:
    """Whether one more timing re-run of batch 0 fits: the re-runs so far and this one (expected to cost
    ``next_s``, the latest call's time) stay within ``share`` of ``base_s``, what the job had cost before
    them. ``share`` None: no bound (``timing.repeats`` calls whatever they cost)."""
    return share is None or extra_s + next_s <= share * base_s


def describe(summary: dict[str, Any], repeats: int, share: Optional[float]) -> str:
    """The console's generate line (after ``generate: ``, before the efficiency figures): the figure, how many
    timed calls it rests on, and why there are fewer than ``timing.repeats`` when the bound stopped them."""
    calls = summary["steady_calls"]
    bound = f"timing.max_extra_share={'null' if share is None else f'{share:g}'} of the job's " \
            f"{summary['timing_base_s']:.3g} s so far"
    if not calls:
        return (f"{summary['generate_s']:.3f} s/batch from the first call alone (no steady-state call: one would "
                f"cost over {bound}; timing.max_extra_share=null for a median of {repeats}), "
                f"{summary['images_per_s']:.2f} images/s")
    note = f"; call {calls + 1} would cost over {bound}" if calls < repeats else ""
    return (f"{summary['generate_s']:.3f} s/batch median of {calls} (min {summary['generate_s_min']:.3f}, max "
            f"{summary['generate_s_max']:.3f}{note}), {summary['images_per_s']:.2f} images/s")


class Generator:
    """One job's batches through a compiled generate function; a subclass is one parallel mode:
    how params and inputs are placed on devices, and how the generate function is lowered."""

    def __init__(self, pipeline: Any, params: dict, safety_weights: Any, plan: Plan, spec: Spec, devices: list,
                 tokens: Optional[PromptTokens] = None, started: Optional[float] = None):
        """``tokens``: the prompts' tokens as :func:`.program.program_spec` read them (their chunks are kept),
        else read again here; ``started``: time.perf_counter() when the job began (its timing re-runs are
        weighed against the job's cost so far)."""
        self.pipeline, self.params, self.safety_weights = pipeline, params, safety_weights
        self.plan, self.spec, self.devices = plan, spec, devices  # spec: what shapes the program (engine/program.py)
        # The images' size: the program's, or its second pass's (Hires. fix, engine/hires.py)
        self.height, self.width = (spec.hires.height, spec.hires.width) if spec.hires else (spec.height, spec.width)
        self.timings = Timings()
        self.started = started
        self.compiled: Optional[Callable] = None  # the sampling program (install)
        self.decoder: Optional[Callable] = None  # the decoding program (install_decoder)
        self.decoder_flops: Optional[float] = None  # its FLOPs on one device's batch (XLA's count; None: unknown)
        self._program_memory: Optional[tuple[Any, Optional[int]]] = None  # (the programs, their bytes): program_memory
        # For a stored executable: traces the program instead, should it fail at its first call.
        self.retrace: Optional[Callable[[Exception], None]] = None
        self.non_finite: set[int] = set()  # indices of images with NaN or infinite pixels (overflow)
        # With a step cache (cached): the denoiser calls its batches made, and those the cache skipped, over every
        # device (the program returns each device's skipped calls beside its pixels: engine/program.py)
        self.denoiser_calls = self.denoiser_calls_skipped = 0
        self.tokens = tokens or FAMILIES[spec.family].tokens(pipeline, plan)
        self.negative_ids = None
        # Placed once: the negative prompt's token weights (A1111's syntax), the refiner's empty-prompt ids and weights
        self.weights = {}
        negative = FAMILIES[spec.family].negative(plan.negative, pipeline, spec.prompt_chunks)
        if negative is not None:
            ids, weights = self.tokens([negative] * plan.images_per_batch, spec.prompt_chunks)
            self.negative_ids = self.place_ids(ids)
            if weights is not None:
                self.weights["negative_weights"] = self.place_ids(weights)
        elif spec.refiner:  # the base's zeros; the refiner encodes the empty prompt (engine/refiner.py)
            ids, weights = self.tokens([""] * plan.images_per_batch, spec.prompt_chunks)
            self.weights["refiner_negative_ids"] = self.place_ids(ids)
            if weights is not None:
                self.weights["refiner_negative_weights"] = self.place_ids(weights)
        # The mode's inputs (engine/modes): its images fitted to the run's size, one row per prompt, and its
        # numbers (the start step from strength, the ControlNet's conditioning scale), placed once.
        self.per_prompt = {name: array for name, array in
                           plan.inputs.arrays(len(plan.prompts), spec.height, spec.width, plan.resize_mode).items()
                           if name in PER_IMAGE[spec.mode]}
        numbers = {"start": np.int32(plan.start_step), "control_scale": np.float32(plan.conditioning_scale),
                   "control_mode": np.int32(plan.control_mode or 0),
                   "control_start": np.float32(plan.control_window[0]), "control_end": np.float32(plan.control_window[1]),
                   "guidance_rescale": np.float32(plan.guidance_rescale or 0.0),
                   "true_cfg_scale": np.float32(plan.true_cfg_scale or 0.0),
                   "hires_guidance": np.float32(plan.hires.guidance if plan.hires and plan.hires.guidance else 0.0),
                   "refiner_cutoff": np.int32(cutoff(plan.refiner, pipeline) if plan.refiner else 0),
                   **{GUIDER_INPUT + key: np.float32(value) for key, value in plan.guider.settings},
                   **{CACHE_INPUT + key: np.float32(value) for key, value in plan.cache.traced}}
        names = (NUMBERS[spec.mode] + (("guidance_rescale",) if spec.cfg_rescale else ())
                 + (("true_cfg_scale",) if spec.true_cfg else ())
                 + tuple(GUIDER_INPUT + key for key, _ in plan.guider.settings)
                 + tuple(CACHE_INPUT + key for key, _ in plan.cache.traced)
                 + (("hires_guidance",) if spec.hires and spec.hires.guided else ())
                 + (("refiner_cutoff",) if spec.refiner else ()))
        self.numbers = {name: self.place_number(numbers[name]) for name in names}

    @property
    def cached(self) -> bool:
        """Whether the program runs a step cache (``spec.cache``), and so returns the skipped calls too."""
        return self.spec.cache != CACHE_DEFAULT

    def install(self, compiled: Callable, retrace: Optional[Callable[[Exception], None]] = None) -> None:
        """Run batches with ``compiled`` (engine/engine.py compiles or finds it); ``retrace``, for a stored
        executable: called with the error should it fail at its first call, and installs a traced one."""
        self.compiled, self.retrace = compiled, retrace

    def install_decoder(self, decoder: Callable, flops: Optional[float]) -> None:
        """Make the batches' images with ``decoder``, the decoding program (engine/engine.py compiles or finds it),
        of ``flops`` on one device's batch (None: unknown)."""
        self.decoder, self.decoder_flops = decoder, flops

    def program_memory(self) -> Optional[int]:
        """XLA's plan of the installed programs' bytes per device (efficiency.program_memory): the larger of the
        sampling and the decoding program's (they run one after the other). Asked once per pair: each job of a sweep
        reads it twice, and XLA works it out anew each time (0.03-0.3 s on a CPU)."""
        if self._program_memory is None or self._program_memory[0] != (self.compiled, self.decoder):
            plans = [efficiency.program_memory(program) for program in (self.compiled, self.decoder) if program]
            known = [plan for plan in plans if plan is not None]
            self._program_memory = ((self.compiled, self.decoder), max(known) if known and known == plans else None)
        return self._program_memory[1]

    def decoder_params(self) -> dict:
        """The decoding program's weights: the VAE's, as placed."""
        return {"vae": self.params["vae"]}

    def decoder_args(self) -> tuple:
        """The arguments the decoding program takes (their shapes key a stored executable): the VAE's weights and the
        sampling program's latents (their shape and dtype, from the installed sampling program)."""
        import jax

        latents = self.latents_info()
        return self.decoder_params(), jax.ShapeDtypeStruct(latents.shape, latents.dtype)

    def latents_info(self):
        """The installed sampling program's latents, as XLA gives them (shape, dtype, sharding)."""
        out = self.compiled.out_info  # type: ignore[union-attr]
        return out[0] if self.cached else out

    def lower_decoder(self):
        """The decoding program lowered for :meth:`decoder_args` (each parallel mode its own way)."""
        raise NotImplementedError

    def decoded(self, out):
        """The sampling program's output with its latents made images by the decoding program (asynchronously)."""
        assert self.decoder is not None  # installed by engine/engine.py
        if self.cached:
            latents, skipped = out
            return self.decoder(self.decoder_params(), latents), skipped
        return self.decoder(self.decoder_params(), out)

    @staticmethod
    def place_params(tree, devices: list):
        """Host arrays -> this mode's placed copy on ``devices``."""
        raise NotImplementedError

    @classmethod
    def place_weights(cls, tree, devices: list, placement: str):
        """The model's weights on ``devices`` (parallelism.params): a whole copy on each (``replicated``), or split
        (``sharded``: engine/sharded.py only; the config refuses it with pmap)."""
        if placement != "replicated":
            raise ValueError(f"{cls.__name__} places weights replicated only, not {placement}")
        return cls.place_params(tree, devices)

    def place_ids(self, ids: np.ndarray):
        raise NotImplementedError

    def place_keys(self, keys: np.ndarray):
        raise NotImplementedError

    def place_number(self, value: np.generic):
        """A number every device reads (a scalar of the program)."""
        raise NotImplementedError

    def inputs(self, batch: int) -> tuple:
        """The batch's prompt ids, per-device keys and mode inputs (each image's rows, by its prompt; with
        A1111's syntax the token weights), placed for this path."""
        ids, weights = self.tokens(self.plan.batch_prompts(batch), self.spec.prompt_chunks)
        start = batch * self.plan.images_per_batch
        rows = [slot.prompt_index for slot in self.plan.images[start: start + self.plan.images_per_batch]]
        mode_inputs = dict(self.numbers, **self.weights,
                           **{name: self.place_ids(array[rows]) for name, array in self.per_prompt.items()})
        if weights is not None:
            mode_inputs["prompt_weights"] = self.place_ids(weights)
        ids = self.place_ids(ids)
        return ids, self.place_keys(batch_keys(self.plan.seed, batch, self.plan.num_devices)), mode_inputs

    def program_args(self) -> tuple:
        """The arguments the compiled program takes (their shapes and shardings key a stored executable)."""
        raise NotImplementedError

    def lower(self):
        raise NotImplementedError

    def run(self, *inputs):
        """One batch's images (:meth:`decoded`), asynchronously."""
        raise NotImplementedError

    def fetch(self, out) -> np.ndarray:
        """The batch's images on the host, (images, H, W, 3) floats in [0, 1]; with a step cache, its counts of the
        batch's denoiser calls taken too."""
        if self.cached:
            out, skipped = out
            self.denoiser_calls += self.spec.steps * self.plan.num_devices
            self.denoiser_calls_skipped += int(np.asarray(self.gathered(skipped)).sum())
        return np.asarray(self.gathered(out)).reshape((-1, self.height, self.width, 3))

    def gathered(self, out):
        """One output of the program, whole on this host (a multi-process run's, from every process)."""
        return out

    def _timed(self, inputs: tuple) -> tuple[Any, float]:
        import jax

        started = time.perf_counter()
        out = jax.block_until_ready(self.run(*inputs))
        return out, time.perf_counter() - started

    def _first(self, inputs: tuple) -> tuple[Any, float]:
        """The first call; a stored executable that fails in it is replaced by a traced one, once."""
        from jax.errors import JaxRuntimeError

        try:
            return self._timed(inputs)
        except JaxRuntimeError as exc:
            if self.retrace is None:
                raise
            retrace, self.retrace = self.retrace, None
            retrace(exc)
            return self._timed(inputs)

    def generate(self, on_batch: Callable[[], Any] = lambda: None) -> Iterator[np.ndarray]:
        """Yield each batch's images (N, H, W, 3) as uint8, recording timings."""
        for batch in range(self.plan.num_batches):
            out, seconds = (self._first if batch == 0 else self._timed)(self.inputs(batch))
            if batch == 0:
                self.timings.first_batch_s = seconds
            else:
                self.timings.steady_s.append(seconds)
            images = self.fetch(out)
            # A NaN pixel becomes 0 in uint8: an overflow (fp16's small range, say) would pass as a black image.
            finite = np.isfinite(images).reshape(len(images), -1).all(axis=1)
            self.non_finite.update(int(i) + batch * self.plan.images_per_batch for i in np.flatnonzero(~finite))
            yield self._to_uint8(images)
            on_batch()
        self._time_steady_state()

    def _time_steady_state(self) -> None:
        """Re-run batch 0 (outputs discarded) until ``timing.repeats`` steady-state calls exist, while the
        re-runs stay within ``timing.max_extra_share`` of what the job had cost before them
        (extra_call_affordable). Every process of a cluster makes the same calls: they stop when any would."""
        from sdjax_runner.engine.distributed import agree

        timings, share = self.timings, self.plan.max_extra_share
        batches_s = timings.first_batch_s + sum(timings.steady_s)
        timings.base_s = batches_s if self.started is None else time.perf_counter() - self.started
        first = None
        while len(timings.steady_s) < self.plan.repeats:
            latest = timings.steady_s[-1] if timings.steady_s else timings.first_batch_s
            if agree(not extra_call_affordable(sum(timings.extra_s), latest, timings.base_s, share)):
                break
            first = first or self.inputs(0)
            seconds = self._timed(first)[1]
            timings.steady_s.append(seconds)
            timings.extra_s.append(seconds)

    def _to_uint8(self, images: np.ndarray) -> np.ndarray:
        # Non-finite pixels were counted in images(); they are saved black (0), without NumPy's cast warning.
        images = np.nan_to_num(images, nan=0.0, posinf=0.0, neginf=0.0)
        pixels = (images * 255).round().astype("uint8")  # as pipeline.numpy_to_pil does
        if getattr(self.pipeline, "safety_checker", None) is not None:  # SD 1.x/2.x only
            pixels, _ = self.pipeline.run_safety_checker(pixels, self.safety_weights)
        return pixels
