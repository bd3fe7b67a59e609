"""The reuse cache: what one process keeps between jobs. Hydra's basic launcher runs a multirun's
jobs one after another in the same process, so a sweep over seeds, prompts or guidance scales
loads the model, places its weights and compiles the generate function once.

Keys say what determines each piece:

    model      path, revision, variant, safety checker, weights and activations dtype, checkpoint and its hash
    ControlNet + controlnet.model (one held per model)
    pipeline   + scheduler name and overrides, prediction type, attention (from the program spec)
    placed     + the parallel mode and the devices the weights are placed on
    compiled   + the program spec (engine/program.py: steps, size, per-device batch, negative prompt or not,
               the scheduler, attention, mode and sampler -- every static setting, read in one function)

A program depends on the model's structure, not on its weights: models that differ only in their
single-file checkpoint (same base configs) share compiled programs, so a sweep over fine-tunes
compiles once.

Guidance scale, seed and prompts are traced inputs: changing them reuses everything. At most
``reuse.max_models`` models are held; the least recently used is released before another loads.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.plan import Plan
from sdjax_runner.config.quantizers import DEFAULT as QUANTIZE_DEFAULT
from sdjax_runner.console import shown
from sdjax_runner.engine import compile_cache
from sdjax_runner.engine.families import FAMILIES
from sdjax_runner.engine.generate import Generator
from sdjax_runner.engine.program import Spec
from sdjax_runner.engine.tokens import TOKENS
from sdjax_runner.errors import UserError
from sdjax_runner.models.controlnet import check_kind, check_mode
from sdjax_runner.models.loaders import load_model
from sdjax_runner.models.loading import LoadedModel, non_finite_weights

log = logging.getLogger("sdjax_runner")


@dataclass
class Counters:
    """How often this process did each expensive step (tests and timings.json read these)."""

    model_loads: int = 0
    compiles: int = 0


@dataclass
class ModelEntry:
    loaded: LoadedModel
    structure: tuple  # the model key without the weights' source: what its programs depend on
    pipelines: dict[tuple, tuple[Any, Any]] = field(default_factory=dict)  # pipeline key -> (pipeline, host state)
    placed_on: tuple = ()  # (parallel mode, device ids) ``placed_weights`` are on
    placed_weights: Any = None
    lora_on: tuple = ()  # (adapter files and hashes, placement) ``lora_factors`` are for
    lora_factors: dict = field(default_factory=dict)  # (component, kernel path, adapter) -> placed (down, up)
    controlnet_key: tuple = ()  # (controlnet.model) ``controlnet`` was loaded for, one at a time
    controlnet: Any = None  # models/controlnet.LoadedControlNet
    controlnet_on: tuple = ()  # the placement ``controlnet_weights`` are on
    controlnet_weights: Any = None
    refiner_key: tuple = ()  # (its path, its weights' hash) ``refiner`` was loaded for, one at a time
    refiner: Any = None  # models/refiner.LoadedRefiner
    refiner_on: tuple = ()  # the placement ``refiner_weights`` are on
    refiner_weights: Any = None
    vae_key: tuple = ()  # (model.vae, its hash) the pipeline's VAE and host_weights["vae"] are; () the model's own
    own_vae: Optional[tuple] = None  # (module, host weights) of the model's own VAE, kept while another runs
    vae_stale: bool = False  # placed_weights' VAE is not host_weights' (swapped since they were placed)
    vae_structure: str = ""  # a swapped VAE folder's config (its programs differ); "" the model's own config
    embeddings_on: tuple = ()  # (prompts.embeddings' files and hashes, placement) ``embeddings`` are placed for
    embeddings: Any = None  # their tables, placed (params["embeddings"])
    quantized_key: tuple = ()  # (quantize=NAME, the LoRA adapters and scales merged first) ``quantized_weights`` are for
    quantized_weights: Any = None  # the denoiser's host weights, quantized (models/quantize.py)
    quantized_component: str = ""  # which component they are ("unet", "transformer")


# Compiled programs a process keeps (an executable is host memory of a few MB to some hundred MB).
MAX_PROGRAMS = 16


def _key(spec: Any, *names: str) -> tuple:
    return tuple(repr(getattr(spec, name)) for name in names)


@dataclass
class Prepared:
    """What a job needs to generate, and whether each piece was reused."""

    pipeline: Any
    params: dict  # placed: weights and scheduler state, as the generate function takes them
    attention: str
    safety_weights: Any
    compiled: Optional[Callable]
    entry: ModelEntry
    compile_key: tuple  # (model structure, VAE structure, placement of the weights, program spec)
    load_s: float
    replicate_s: float

    @property
    def weights_key(self) -> tuple:
        """The compile key without the program's spec: the model and its weights as placed (what the decoding
        program depends on besides its own settings)."""
        return self.compile_key[:3]


def refuse_non_finite(weights: dict, key: str, source: str) -> None:
    """Weights holding NaN or inf (a damaged file, a broken conversion) are one line at load: they made black
    images whose warning blamed the guidance."""
    bad = non_finite_weights(weights)
    if bad:
        raise UserError(key, f"{shown(source)} has NaN or infinite values in {bad[0]}"
                        + (f" and {len(bad) - 1} more weight(s)" if len(bad) > 1 else "")
                        + ": its images would be black", "finite weights (a damaged or badly converted file?)")


class ReuseCache:
    def __init__(self) -> None:
        self.models: collections.OrderedDict[tuple, ModelEntry] = collections.OrderedDict()
        self.programs: collections.OrderedDict[tuple, Callable] = collections.OrderedDict()  # compile key -> program
        self.flops_of: dict[tuple, Any] = {}  # compile key -> FLOPs per batch
        # decoder key (engine/engine.py) -> (the decoding program, its FLOPs on one device's batch or None); one per
        # model, placement and latent size: what a sweep's sampling programs share
        self.decoders: collections.OrderedDict[tuple, tuple[Callable, Optional[float]]] = collections.OrderedDict()
        self.counters = Counters()

    def model(self, plan: Plan) -> tuple[ModelEntry, bool]:
        """The plan's model, loaded or reused (then True)."""
        key = _key(plan.model, "pretrained_model_name_or_path", "revision", "variant", "safety_checker", "builtin",
                   "allow_pickle", "t5")
        structure = key + _key(plan.dtype, "weights_dtype", "activations_dtype")
        key = structure + (plan.checkpoint,)
        if key in self.models:
            self.models.move_to_end(key)
            self.swap_vae(plan, self.models[key])
            return self.models[key], True
        while len(self.models) >= plan.max_models:
            self.models.popitem(last=False)
            gc.collect()  # release the old weights before the new ones arrive
        loaded = load_model(plan.model, plan.dtype, plan.checkpoint.sha256 if plan.checkpoint else None)
        refuse_non_finite(loaded.host_weights, "model.pretrained_model_name_or_path", loaded.path)
        entry = ModelEntry(loaded, structure)
        self.counters.model_loads += 1
        self.models[key] = entry
        self.swap_vae(plan, entry)
        return entry, False

    def swap_vae(self, plan: Plan, entry: ModelEntry) -> None:
        """``entry`` running the plan's VAE (model.vae; none: the model's own), read and swapped in only when it
        changes: the rest of the model stays loaded and placed (a sweep over VAEs loads the model once)."""
        from sdjax_runner.models import vae_swap

        key = (plan.vae.path, plan.vae.sha256) if plan.vae else ()
        if entry.vae_key == key:
            return
        loaded = entry.loaded
        if entry.own_vae is None:
            entry.own_vae = (loaded.pipeline.vae, loaded.host_weights["vae"])
        if plan.vae:
            swapped = vae_swap.load_vae(Path(plan.vae.path), entry.own_vae[0], loaded.family, loaded.path, plan.dtype,
                                        plan.vae.sha256)
            module, weights = swapped.module, swapped.params
            refuse_non_finite({"vae": weights}, "model.vae", plan.vae.path)
            log.info("load: VAE %s (%s)", shown(Path(plan.vae.path).name),
                     "its own config" if swapped.format == "folder" else "on the model's VAE config")
        else:
            module, weights = entry.own_vae
        loaded.pipeline = with_vae(loaded.pipeline, module)
        loaded.host_weights = dict(loaded.host_weights, vae=weights)
        entry.pipelines.clear()  # made with the old VAE module
        entry.vae_stale = entry.placed_weights is not None
        own = entry.own_vae[0]
        same = module is own or (dict(module.config) == dict(own.config) and module.dtype == own.dtype)
        entry.vae_structure = "" if same else repr((sorted(dict(module.config).items()), str(module.dtype)))
        entry.vae_key = key

    def controlnet(self, plan: Plan, entry: ModelEntry) -> tuple[Any, bool]:
        """The plan's ControlNet (controlnet mode), loaded beside ``entry``'s model or reused (then True);
        else (None, False)."""
        if not plan.controlnet:
            return None, False
        key = (plan.controlnet,)
        reused = entry.controlnet_key == key
        if not reused:
            import jax.numpy as jnp

            from sdjax_runner.models.loading import numpy_dtype

            entry.controlnet, entry.controlnet_on, entry.controlnet_weights = None, (), None
            load = FAMILIES[entry.loaded.family].load_controlnet
            assert load is not None  # (config/modes: a family that runs controlnet mode loads ControlNets)
            entry.controlnet = load(plan.controlnet, plan.cache_dir, entry.loaded.pipeline,
                                    getattr(jnp, plan.dtype.activations_dtype.name),
                                    numpy_dtype(plan.dtype.weights_dtype.name))
            entry.controlnet_key = key
        check_kind(entry.controlnet, plan.generation, plan.controlnet)
        check_mode(entry.controlnet, plan.control_mode, plan.controlnet)
        return entry.controlnet, reused

    def refiner(self, plan: Plan, entry: ModelEntry) -> tuple[Any, bool]:
        """The plan's refiner (model.refiner), loaded beside ``entry``'s model or reused (then True); else (None,
        False)."""
        if plan.refiner is None:
            return None, False
        key = (plan.refiner.path, plan.refiner.sha256)
        reused = entry.refiner_key == key
        if not reused:
            import jax.numpy as jnp

            from sdjax_runner.models import refiner
            from sdjax_runner.models.loading import numpy_dtype

            entry.refiner, entry.refiner_on, entry.refiner_weights, entry.refiner_key = None, (), None, ()
            gc.collect()  # the old refiner's weights go before the new ones arrive
            entry.refiner = refiner.load(plan.refiner, entry.loaded.pipeline,
                                         getattr(jnp, plan.dtype.activations_dtype.name),
                                         numpy_dtype(plan.dtype.weights_dtype.name))
            entry.refiner_key = key
        return entry.refiner, reused

    def prepare(self, plan: Plan, entry: ModelEntry, reused: bool, mode: type[Generator], devices: list,
                spec: Spec, embeddings: Any = None) -> Prepared:
        """Pipeline with the plan's scheduler, params placed on ``devices`` and, if compiled before, the
        program: one per model structure, devices and program :class:`~.program.Spec`. ``embeddings``: the
        prompts' textual-inversion embeddings as their tokens read them (models/embeddings.Embeddings), or None."""
        import jax

        pipeline_key = (spec.scheduler, spec.scheduler_overrides, spec.prediction_type, spec.attention, spec.quantize)
        if pipeline_key not in entry.pipelines:
            made, made_state = FAMILIES[entry.loaded.family].with_scheduler(
                entry.loaded, plan.scheduler, plan.model.prediction_type, plan.attention)
            entry.pipelines[pipeline_key] = (quantized_pipeline(made, spec), made_state)
        pipeline, state = entry.pipelines[pipeline_key]

        started = time.perf_counter()
        placement = (plan.mode, tuple(d.id for d in devices))
        weights_on = placement + (plan.params_placement, self.quantized(plan, entry, pipeline, spec))
        if entry.placed_on != weights_on:
            entry.placed_weights = None  # one placed copy per model at a time
            entry.placed_weights = mode.place_weights(host_weights(entry), devices, plan.params_placement)
            entry.placed_on = weights_on
        elif entry.vae_stale:  # another VAE since the weights were placed: only it is placed again
            vae = mode.place_weights({"vae": entry.loaded.host_weights["vae"]}, devices, plan.params_placement)
            entry.placed_weights = dict(entry.placed_weights, vae=vae["vae"])
        entry.vae_stale = False
        params = dict(entry.placed_weights, scheduler=mode.place_params(state, devices))
        if embeddings is not None:  # textual-inversion tables: inputs of the program, placed once
            key = (plan.embeddings, placement)
            if entry.embeddings_on != key:
                entry.embeddings, entry.embeddings_on = mode.place_params(embeddings.tables, devices), key
                log.info("prompts: %d textual-inversion embedding(s): %s", len(plan.embeddings),
                         ", ".join(shown(e.name) for e in plan.embeddings))
            params["embeddings"] = entry.embeddings
        if plan.lora:  # merged on the devices; the scales are inputs, so no new program
            params = self.with_lora(plan, entry, mode, devices, placement, params, entry.quantized_component)
        if entry.controlnet is not None and plan.controlnet:
            if entry.controlnet_on != placement:
                entry.controlnet_weights = mode.place_params(entry.controlnet.host_weights, devices)
                entry.controlnet_on = placement
            params["controlnet"] = entry.controlnet_weights
            # read by the program (engine/samplers/unet.py), with the run's attention
            pipeline.controlnet = entry.controlnet.with_attention(plan.attention)
        if entry.refiner is not None and plan.refiner is not None:
            if entry.refiner_on != placement:
                entry.refiner_weights = mode.place_params(entry.refiner.host_weights, devices)
                entry.refiner_on = placement
            params["refiner"] = entry.refiner_weights
            # its modules, read by the program (engine/refiner.py), its UNet with the run's attention
            pipeline.refiner = dataclasses.replace(entry.refiner, unet=entry.refiner.unet.clone(attention=plan.attention))
        jax.block_until_ready(params)
        replicate_s = time.perf_counter() - started

        compile_key = (entry.structure, entry.vae_structure, weights_on, spec)
        return Prepared(pipeline, params, plan.attention, entry.loaded.safety_weights, self.programs.get(compile_key),
                        entry, compile_key, 0.0 if reused else entry.loaded.load_s, replicate_s)

    def quantized(self, plan: Plan, entry: ModelEntry, pipeline: Any, spec: Spec) -> tuple:
        """What the denoiser's weights are quantized for (quantize=NAME: config/quantizers.py), made on the host
        when that changes -- the plan's LoRA adapters merged at their scales first, then quantized
        (models/quantize.py) -- and kept on ``entry`` (one quantized copy at a time); () for none."""
        if spec.quantize == QUANTIZE_DEFAULT:
            entry.quantized_key, entry.quantized_weights, entry.quantized_component = (), None, ""
            return ()
        from sdjax_runner.models import lora, quantize
        from sdjax_runner.models.loaders import LOADERS

        key = (spec.quantize, tuple((adapter.path, adapter.sha256, adapter.scale) for adapter in plan.lora))
        if entry.quantized_key != key:
            entry.quantized_key, entry.quantized_weights = (), None
            gc.collect()  # the old copy goes before the new one is made
            started = time.perf_counter()
            family = FAMILIES[entry.loaded.family]
            call, component = family.denoiser_call(pipeline, 1, spec.height, spec.width, spec.prompt_tokens), family.denoiser
            weights = entry.loaded.host_weights[component]
            merged = 0
            if plan.lora:
                adapters = [lora.read(given.path, entry.loaded.host_weights, f"lora.{index}.path", given.sha256,
                                      LOADERS[entry.loaded.family].lora_modules)
                            for index, given in enumerate(plan.lora)]
                weights, merged = lora.merged_on_host(weights, component, adapters,
                                                      [given.scale for given in plan.lora])
            entry.quantized_weights = quantize.quantized_weights(getattr(pipeline, component), weights, call.args,
                                                                 call.kwargs)
            entry.quantized_component, entry.quantized_key = component, key
            log.info("quantize: %s weights of the %s in %.1f s%s", spec.quantize, component,
                     time.perf_counter() - started,
                     f", the LoRA adapters merged into {merged} of its layer(s) first" if plan.lora else "")
        return key

    def with_lora(self, plan: Plan, entry: ModelEntry, mode: type[Generator], devices: list, placement: tuple,
                  params: dict, merged_already: str = "") -> dict:
        """``params`` with the plan's LoRA adapters merged at their scales; the adapters are read and
        placed once per model and placement (a scale sweep only merges again). ``merged_already``: a component
        whose weights came merged (quantized after merging on the host: :meth:`quantized`), left as placed."""
        from sdjax_runner.models import lora
        from sdjax_runner.models.loaders import LOADERS

        key = (tuple((adapter.path, adapter.sha256) for adapter in plan.lora), placement, merged_already)
        if entry.lora_on != key:
            entry.lora_factors, entry.lora_on = {}, ()
            for index, given in enumerate(plan.lora):
                adapter = lora.read(given.path, entry.loaded.host_weights, f"lora.{index}.path", given.sha256,
                                      LOADERS[entry.loaded.family].lora_modules)
                for (component, kernel_path), pair in adapter.factors.items():
                    if component != merged_already:
                        entry.lora_factors[(component, kernel_path, index)] = mode.place_params(pair, devices)
            entry.lora_on = key
        merged = lora.merged_params(params, entry.lora_factors, [given.scale for given in plan.lora], plan.mode)
        for index, given in enumerate(plan.lora):
            touched = collections.Counter(component for component, _, i in entry.lora_factors if i == index)
            log.info("lora: %s at scale %g merged into %d layer(s) (%s)", shown(Path(given.path).name), given.scale,
                     sum(touched.values()), ", ".join(f"{name} {count}" for name, count in sorted(touched.items())))
        return merged

    def compile(self, prepared: Prepared, lower: Callable[[], Any], fresh: bool = False
                ) -> tuple[Callable, float, float, bool]:
        """(compiled function, trace+lower seconds, XLA compile seconds, served by the persistent cache);
        ``fresh``: compiled by XLA here, not served by the persistent cache (to be stored whole)."""
        started = time.perf_counter()
        lowered = lower()
        traced = time.perf_counter()
        hits = compile_cache.hits()  # only the XLA compile of this program counts
        with compile_cache.bypassed() if fresh else contextlib.nullcontext():
            compiled = lowered.compile()
        trace_s, compile_s = traced - started, time.perf_counter() - traced
        self.keep(prepared.compile_key, compiled)
        self.counters.compiles += 1
        return compiled, trace_s, compile_s, compile_cache.hits() > hits

    def adopt(self, prepared: Prepared, compiled: Any) -> None:
        """A program loaded from the executable cache, as if compiled here."""
        self.keep(prepared.compile_key, compiled)

    def know_flops(self, prepared: Prepared, flops: Optional[float]) -> None:
        """The FLOPs of a batch of the prepared program, counted by an earlier process (None: unknown)."""
        if flops is not None:
            self.flops_of[prepared.compile_key] = flops

    def keep_decoder(self, key: tuple, compiled: Callable, flops: Optional[float]) -> None:
        self.decoders[key] = (compiled, flops)
        self.decoders.move_to_end(key)
        while len(self.decoders) > MAX_PROGRAMS:
            self.decoders.popitem(last=False)

    def keep(self, compile_key: tuple, compiled: Callable) -> None:
        self.programs[compile_key] = compiled
        while len(self.programs) > MAX_PROGRAMS:  # the least recently compiled first
            old, _ = self.programs.popitem(last=False)
            self.flops_of.pop(old, None)

    def flops(self, prepared: Prepared, compiled: Any, passes: tuple[tuple[int, int, int, float], ...],
              num_devices: int, tokens: int = TOKENS, mode: str = "txt2img", references: int = 0) -> Any:
        """FLOPs of one batch (XLA's count, see efficiency.py), once per compiled program. ``passes``: each sampling
        loop's (steps, height, width, images per device its denoiser call counts: Spec.calls_per_step) -- one, or
        two with Hires. fix's second pass; ``mode``, ``references``: the program's (what its denoiser call reads)."""
        from sdjax_runner.engine import efficiency

        if prepared.compile_key not in self.flops_of:
            family = FAMILIES[prepared.entry.loaded.family]
            loops = [(steps, efficiency.step_flops(family.denoiser_call(prepared.pipeline, images, height, width, tokens,
                                                                        mode=mode, references=references),
                                                   family.denoiser, prepared.pipeline, host_weights(prepared.entry)))
                     for steps, height, width, images in passes]
            self.flops_of[prepared.compile_key] = efficiency.batch_flops(compiled, loops, num_devices)
        return self.flops_of[prepared.compile_key]

    @staticmethod
    def saved_per_skipped_call(prepared: Prepared, cache: str, shape: tuple, images: float, height: int, width: int,
                               tokens: int) -> Any:
        """FLOPs a denoiser call that step cache ``cache`` (with its shaping settings, ``shape``) skipped did not
        run: a whole call's count less that of what such a call still runs (the family's ``skipped_calls``); None
        where either is unknown."""
        from sdjax_runner.engine import efficiency

        family = FAMILIES[prepared.entry.loaded.family]
        call, weights = family.denoiser_call(prepared.pipeline, images, height, width, tokens), host_weights(prepared.entry)
        whole = efficiency.step_flops(call, family.denoiser, prepared.pipeline, weights)
        skipping = family.skipped_calls[cache](shape, prepared.pipeline, weights[family.denoiser], call)
        skipped = efficiency.step_flops(call, family.denoiser, prepared.pipeline, weights, (f"{cache}{shape}", skipping))
        return None if whole is None or skipped is None else whole - skipped


def host_weights(entry: ModelEntry) -> dict:
    """The weights to place: the model's, with the denoiser's quantized where the job quantizes (its
    :meth:`ReuseCache.quantized` made them)."""
    if not entry.quantized_component:
        return entry.loaded.host_weights
    return dict(entry.loaded.host_weights, **{entry.quantized_component: entry.quantized_weights})


def quantized_pipeline(pipeline: Any, spec: Spec) -> Any:
    """``pipeline`` (a dataclass) whose denoiser Qwix runs quantized (``spec.quantize``; none: ``pipeline``)."""
    if spec.quantize == QUANTIZE_DEFAULT:
        return pipeline
    from sdjax_runner.models.quantize import quantized_module

    component = FAMILIES[spec.family].denoiser
    return dataclasses.replace(pipeline, **{component: quantized_module(getattr(pipeline, component), spec.quantize)})


def with_vae(pipeline: Any, module: Any) -> Any:
    """``pipeline`` (a dataclass) running the VAE ``module``; a flow model's with the module's scaling and shift
    factors."""
    if not hasattr(pipeline, "scaling_factor"):  # the SD family's reads them from the VAE's config
        return dataclasses.replace(pipeline, vae=module)
    shift = getattr(module, "shift_factor", None)
    return dataclasses.replace(pipeline, vae=module, scaling_factor=float(module.scaling_factor),
                               shift_factor=float(shift) if shift is not None else 0.0)
