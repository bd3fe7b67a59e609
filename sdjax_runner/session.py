"""What one process keeps between jobs: Hydra's basic launcher runs a multirun's jobs one
after another in the same process, so a sweep over seeds, prompts or guidance scales loads
the model, replicates its params and compiles the generate function once.

Keys say what determines each piece:

    model      path, revision, variant, safety checker, weights and activations dtype
    pipeline   + scheduler name and overrides          (the pipeline object is a static argument)
    params     + the devices they are replicated to
    compiled   + steps, height, width, per-device batch, negative prompt or not

Guidance scale, seed and prompts are traced inputs: changing them reuses everything. At most
``reuse.max_models`` models are held; the least recently used is released before another loads.
"""

from __future__ import annotations

import collections
import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from sdjax_runner import compile_cache
from sdjax_runner.attention import tracing_with
from sdjax_runner.loading import LoadedModel, load_model, with_scheduler
from sdjax_runner.parallel import PLACEMENTS


@dataclass
class Counters:
    """How often this process did each expensive step (tests and timings.json read these)."""

    model_loads: int = 0
    compiles: int = 0


@dataclass
class ModelEntry:
    loaded: LoadedModel
    pipelines: dict[tuple, tuple[Any, Any]] = field(default_factory=dict)  # scheduler key -> (pipeline, state)
    weights_on: tuple = ()  # (parallel mode, devices) ``weights`` are placed for
    weights: Any = None
    compiled: dict[tuple, Callable] = field(default_factory=dict)
    flops: dict[tuple, Any] = field(default_factory=dict)  # compile key -> FLOPs per batch


def _key(node: DictConfig, *names: str) -> tuple:
    return tuple(repr(OmegaConf.to_container(node, resolve=True, enum_to_str=True)[n]) for n in names)


@dataclass
class Prepared:
    """What a job needs to generate, and whether each piece was reused."""

    pipeline: Any
    params: dict  # replicated: weights and scheduler state
    attention: str
    safety_params: Any
    compiled: Callable | None
    entry: ModelEntry
    compile_key: tuple
    load_s: float
    replicate_s: float


class Session:
    def __init__(self) -> None:
        self.models: collections.OrderedDict[tuple, ModelEntry] = collections.OrderedDict()
        self.counters = Counters()

    def model(self, cfg: DictConfig) -> tuple[ModelEntry, bool]:
        """The job's model, loaded or reused (then True)."""
        key = _key(cfg.model, "pretrained_model_name_or_path", "revision", "variant", "safety_checker", "builtin",
                   "allow_pickle")
        key += _key(cfg.dtype, "weights_dtype", "activations_dtype")
        if key in self.models:
            self.models.move_to_end(key)
            return self.models[key], True
        while len(self.models) >= cfg.reuse.max_models:
            self.models.popitem(last=False)
            gc.collect()  # release the old weights before the new ones arrive
        entry = ModelEntry(load_model(cfg.model, cfg.dtype))
        self.counters.model_loads += 1
        self.models[key] = entry
        return entry, False

    def prepare(self, cfg: DictConfig, entry: ModelEntry, reused: bool, devices: list, plan_key: tuple) -> Prepared:
        """Pipeline with the job's scheduler, params on ``devices`` and, if compiled before, the program."""
        import jax

        attention = cfg.performance.attention.name
        sched_key = _key(cfg.scheduler, "name", "config_overrides") + _key(cfg.model, "prediction_type") + (attention,)
        if sched_key not in entry.pipelines:
            entry.pipelines[sched_key] = with_scheduler(entry.loaded, cfg.scheduler, cfg.model.prediction_type,
                                                        attention)
        pipeline, state = entry.pipelines[sched_key]

        started = time.perf_counter()
        mode = cfg.parallelism.mode.name
        place = PLACEMENTS[mode]
        placement = (mode, tuple(d.id for d in devices))
        if entry.weights_on != placement:
            entry.weights = None  # one placed copy per model at a time
            entry.weights = place(entry.loaded.weights, devices)
            entry.weights_on = placement
        params = dict(entry.weights, scheduler=place(state, devices))
        jax.block_until_ready(params)
        replicate_s = time.perf_counter() - started

        compile_key = (sched_key, placement) + plan_key
        return Prepared(pipeline, params, attention, entry.loaded.params.get("safety_checker"),
                        entry.compiled.get(compile_key), entry, compile_key, 0.0 if reused else entry.loaded.load_s, replicate_s)

    def compile(self, prepared: Prepared, lower: Callable[[], Any]) -> tuple[Callable, float, float, bool]:
        """(compiled function, trace+lower seconds, XLA compile seconds, served by the persistent cache)."""
        started = time.perf_counter()
        with tracing_with(prepared.attention):
            lowered = lower()
        traced = time.perf_counter()
        hits = compile_cache.hits()  # only the XLA compile of this program counts
        compiled = lowered.compile()
        trace_s, compile_s = traced - started, time.perf_counter() - traced
        prepared.entry.compiled[prepared.compile_key] = compiled
        self.counters.compiles += 1
        return compiled, trace_s, compile_s, compile_cache.hits() > hits

    def flops(self, prepared: Prepared, compiled: Any, steps: int, per_device_images: int, height: int, width: int,
              num_devices: int) -> Any:
        """FLOPs of one batch (XLA's count, see efficiency.py), once per compiled program."""
        from sdjax_runner import efficiency

        if prepared.compile_key not in prepared.entry.flops:
            with tracing_with(prepared.attention):
                unet = efficiency.unet_step_flops(prepared.pipeline, prepared.entry.loaded.weights,
                                                  per_device_images, height, width)
            prepared.entry.flops[prepared.compile_key] = efficiency.batch_flops(compiled, unet, steps, num_devices)
        return prepared.entry.flops[prepared.compile_key]


SESSION = Session()
