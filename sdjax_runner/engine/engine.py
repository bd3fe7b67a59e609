"""The engine: a Plan in, a compiled program out. Between the two it loads (or reuses) the model and checks
what only the loaded model tells, places the weights, makes the program's spec and compiles the program --
reused from an earlier job of this process, loaded from a stored executable (engine/executable_cache.py),
or traced and compiled (and stored) -- and it answers in typed facts: :class:`JobModel`, :class:`Program`
and its :class:`CompileFacts`. Everything family-specific comes from the model's family entry
(engine/families.py). One engine per process (:func:`current`): its reuse cache (engine/reuse.py) is what a
sweep's jobs share."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import process
from sdjax_runner.config import checks, hires
from sdjax_runner.config.families import FAMILIES as FAMILY_ENTRIES
from sdjax_runner.config.families import runs_mode
from sdjax_runner.config.plan import Plan
from sdjax_runner.console import one_line, shown
from sdjax_runner.engine import compile_cache, efficiency, executable_cache
from sdjax_runner.engine.families import FAMILIES, Family
from sdjax_runner.engine.generate import Generator
from sdjax_runner.engine.parallel import PARALLEL
from sdjax_runner.engine.program import Spec, program_spec
from sdjax_runner.engine.refiner import say_unused_refiner
from sdjax_runner.engine.reuse import ModelEntry, Prepared, ReuseCache
from sdjax_runner.errors import UserError
from sdjax_runner.models.loading import LoadedModel

log = logging.getLogger("sdjax_runner")


@dataclass(frozen=True)
class CompileFacts:
    """How the job got its program."""

    path: str  # "reused" (an earlier job of this process compiled it), "executable_cache" (stored), "traced"
    trace_s: float = 0.0  # tracing and lowering, seconds
    compile_s: float = 0.0  # XLA's compile, or loading the stored executable, seconds
    cache_hit: bool = False  # XLA's persistent compilation cache served the compile

    def record(self) -> dict[str, Any]:
        """Its timings.json fields (``compile_cache_hit`` is written beside the reuse counts: the runner's)."""
        return {"trace_s": self.trace_s, "compile_s": self.compile_s, "compile_path": self.path,
                "executable_cache_hit": int(self.path == "executable_cache")}


@dataclass(frozen=True)
class JobModel:
    """The job's model, loaded (or reused) and checked, at the size the job runs."""

    entry: ModelEntry
    reused: bool  # held by this process from an earlier job
    height: int
    width: int
    controlnet: Any = None  # models/controlnet.LoadedControlNet in controlnet mode
    refiner: Any = None  # models/refiner.LoadedRefiner with model.refiner

    @property
    def loaded(self) -> LoadedModel:
        return self.entry.loaded

    @property
    def family(self) -> Family:
        return FAMILIES[self.loaded.family]


@dataclass
class Program:
    """The job's generator with its compiled program installed, and how it was got (updated should a stored
    executable fail at its first call and be traced instead)."""

    generator: Generator
    prepared: Prepared
    facts: CompileFacts
    key: Optional[str] = None  # the stored executable's key, when executables are kept (else None)

    @property
    def spec(self) -> Spec:
        return self.generator.spec


class Engine:
    """This process's engine (:func:`current`)."""

    def __init__(self) -> None:
        self.reuse = ReuseCache()

    def configure(self, plan: Plan) -> None:
        """The plan's cache settings for this process: XLA's persistent cache, where module shapes are kept."""
        compile_cache.configure(plan.compilation_cache)
        cache = plan.compilation_cache
        process.current().shapes_dir = Path(cache.dir).expanduser() / "shapes" if cache.enabled else None

    def load(self, plan: Plan, platform: str) -> JobModel:
        """The plan's model (and ControlNet), loaded or reused, checked against the plan, at its size."""
        entry, reused = self.reuse.model(plan)
        loaded = entry.loaded
        if loaded.family != plan.family:
            raise UserError("model.family", f"{loaded.path} holds a {FAMILY_ENTRIES[loaded.family].title} model, but "
                            f"the run was planned for {plan.family} (model.family; where null, the folder's index "
                            f"if it was on disk when the run was planned, else sd)", loaded.family)
        height, width = image_size(plan, loaded)
        runs_mode(FAMILY_ENTRIES[loaded.family], plan.generation, plan.model.name)  # every family's modes
        FAMILIES[loaded.family].check_loaded(plan, loaded)
        log.info("load: %s %s%s", plan.model.name, "reused from an earlier job of this process" if reused else
                 f"from {loaded.path} in {loaded.load_s:.1f} s",
                 "" if reused else converted_note(loaded.formats, plan.model.variant, loaded.variant_components))
        warn_slow_size(plan, loaded, height, width, platform)
        controlnet, controlnet_reused = self.reuse.controlnet(plan, entry)
        if controlnet is not None:
            log.info("load: ControlNet %s", "reused from an earlier job of this process" if controlnet_reused else
                     f"from {controlnet.path} in {controlnet.load_s:.1f} s ({controlnet.format} weights)")
        refiner, refiner_reused = self.reuse.refiner(plan, entry)
        if refiner is not None:
            log.info("load: refiner %s", "reused from an earlier job of this process" if refiner_reused else
                     f"from {shown(refiner.path)} in {refiner.load_s:.1f} s")
        return JobModel(entry, reused, height, width, controlnet, refiner)

    def program(self, plan: Plan, model: JobModel, devices: list, started: float) -> Program:
        """The job's generator on ``devices`` with its program installed; ``started``: when the job began."""
        from sdjax_runner.config.prompts import check_chunks, named_prompts

        pipeline = model.loaded.pipeline
        tokens = model.family.tokens(pipeline, plan)  # read once: for the chunk count, then the batches
        if plan.syntax == "a1111":  # before the program is made: its shape grows with the chunks
            check_chunks(named_prompts(plan.prompts, plan.prompt_names, plan.negative), tokens.chunks_of)
        spec = program_spec(plan, pipeline, model.height, model.width, model.loaded.family,
                            controlnet=model.controlnet.structure if model.controlnet else "", tokens=tokens,
                            refiner=model.refiner.structure if model.refiner else "")
        say_unused_refiner(pipeline, spec, plan.refiner)
        if spec.prompt_chunks:
            log.info("prompts: A1111's syntax, %d chunk(s) of 75 tokens per prompt (the longest prompt's; shorter "
                     "ones padded with empty chunks)", spec.prompt_chunks)
        mode = PARALLEL[plan.mode]
        prepared = self.reuse.prepare(plan, model.entry, model.reused, mode, devices, spec,
                                      getattr(tokens, "embeddings", None))
        generator = mode(prepared.pipeline, prepared.params, prepared.safety_weights, plan, spec, devices,
                         tokens=tokens, started=started)
        program = self._compiled(Program(generator, prepared, CompileFacts("traced")), plan)
        fits_host_memory(plan, generator, devices, model.height, model.width)
        return program

    def _compiled(self, program: Program, plan: Plan) -> Program:
        """``program`` with its generator's programs installed: the sampling program (:meth:`_sampling`) and then the
        decoding program (:meth:`_decoding`), its seconds added to the job's compile facts."""
        program = self._sampling(program, plan)
        self._decoding(program, plan)
        return program

    def _decoding(self, program: Program, plan: Plan, fresh: bool = False) -> None:
        """The generator's decoding program installed: reused if this process has it (a sweep's other sampling
        programs of this model at this size), loaded if stored, else traced, compiled and stored; ``fresh``: traced
        whatever is kept (a stored one failed)."""
        generator, prepared = program.generator, program.prepared
        args = generator.decoder_args()
        spec = generator.spec
        key = (prepared.weights_key, spec.family, spec.parallel, spec.params, spec.attention, tuple(args[1].shape),
               str(args[1].dtype))
        if key in self.reuse.decoders and not fresh:
            generator.install_decoder(*self.reuse.decoders[key])
            self.reuse.decoders.move_to_end(key)
            return
        started = time.perf_counter()
        compiled, flops, trace_s = self._decoder(generator, args, executables_dir(plan), fresh)
        self.reuse.keep_decoder(key, compiled, flops)
        generator.install_decoder(compiled, flops)
        compile_s = time.perf_counter() - started - trace_s
        log.info("compile: the decoder, %.1f s%s", compile_s, ", stored (no tracing)" if trace_s == 0 else
                 f" (+ {trace_s:.1f} s tracing)")
        program.facts = dataclasses.replace(program.facts, trace_s=program.facts.trace_s + trace_s,
                                            compile_s=program.facts.compile_s + compile_s)

    @staticmethod
    def _decoder(generator: Generator, args: tuple, directory: Optional[str], fresh: bool
                 ) -> tuple[Any, Optional[float], float]:
        """(the decoding program, its FLOPs on one device's batch, seconds of tracing): loaded where executables are
        kept in ``directory`` and one fits (unless ``fresh``), else traced and compiled (and stored there)."""
        started = time.perf_counter()
        stored_key = executable_cache.decoder_key(generator, args) if directory else ""
        if directory:
            if fresh:
                executable_cache.discard(directory, stored_key)
            compiled = executable_cache.load(directory, stored_key, generator.devices, args)
            if compiled is not None:
                return compiled, executable_cache.load_flops(directory, stored_key), 0.0
        lowered = generator.lower_decoder()
        trace_s = time.perf_counter() - started
        with compile_cache.bypassed() if directory else contextlib.nullcontext():  # (as the sampling program's)
            compiled = lowered.compile()
        flops = efficiency.program_flops(compiled)
        if directory:  # (its FLOPs file: one device's batch)
            executable_cache.save(directory, stored_key, compiled, generator.devices)
            executable_cache.save_flops(directory, stored_key, flops)
        return compiled, flops, trace_s

    def _sampling(self, program: Program, plan: Plan) -> Program:
        """``program`` with its generator's sampling program installed: reused if this process has it, loaded if a
        stored executable fits (traced instead should it fail at its first call), else traced and compiled."""
        generator, prepared = program.generator, program.prepared
        if prepared.compiled is not None:
            generator.install(prepared.compiled)
            log.info("compile: reused from an earlier job of this process")
            program.facts = CompileFacts("reused")
            return program
        started = time.perf_counter()
        directory = executables_dir(plan)
        if directory:
            key = program.key = executable_cache.program_key(generator, generator.program_args())
            self.reuse.know_flops(prepared, executable_cache.load_flops(directory, key))
            stored = executable_cache.load(directory, key, generator.devices, generator.program_args())
            if stored is not None:
                self.reuse.adopt(prepared, stored)
                load_s = time.perf_counter() - started
                log.info("compile: %.1f s, the stored executable (no tracing)", load_s)
                program.facts = CompileFacts("executable_cache", compile_s=load_s)

                def retrace(error: Exception) -> None:
                    log.warning("compile: the stored executable failed at its first call (%s); removed, tracing "
                                "instead", one_line(error))
                    executable_cache.discard(directory, key)
                    self._trace(program)
                    self._decoding(program, plan, fresh=True)  # (whichever of the two failed)

                generator.install(stored, retrace)
                return program
        self._trace(program)
        return program

    def _trace(self, program: Program) -> None:
        """Trace, lower and compile the program; stored when executables are kept."""
        generator = program.generator
        log.info("compile: tracing and compiling the %d-step generate function ...", generator.plan.num_inference_steps)
        # A program to be stored is compiled afresh: one the persistent cache served does not reload.
        compiled, trace_s, compile_s, cache_hit = self.reuse.compile(program.prepared, generator.lower,
                                                                     fresh=bool(program.key))
        log.info("compile: %.1f s (+ %.1f s tracing)%s", compile_s, trace_s,
                 ", from the persistent compilation cache" if cache_hit else "")
        if program.key and not cache_hit:
            executable_cache.save(generator.plan.compilation_cache.dir, program.key, compiled, generator.devices)
        generator.install(compiled)
        program.facts = CompileFacts("traced", trace_s, compile_s, cache_hit)

    def efficiency(self, plan: Plan, program: Program, seconds: float) -> dict[str, Any]:
        """flops_per_batch, tflops_per_s, mfu and memory (see engine/efficiency.py); None where not measurable."""
        generator, spec = program.generator, program.spec
        images = plan.per_device_batch_size
        passes: tuple[tuple[int, int, int, float], ...] = (
            (plan.num_inference_steps, spec.height, spec.width, images * spec.calls_per_step),)
        if spec.hires:  # its own guidance may run CFG where the first pass does not, or not where it does
            second = dataclasses.replace(spec, cfg=spec.hires.cfg)
            passes += ((spec.hires.steps, spec.hires.height, spec.hires.width, images * second.calls_per_step),)
        # With a refiner the loop runs two UNets, each on its own steps: not counted yet, so no FLOPs rather than wrong
        flops = None if spec.refiner else self.reuse.flops(program.prepared, generator.compiled, passes,
                                                           plan.num_devices, spec.prompt_tokens, spec.mode,
                                                           spec.references)
        if program.key and flops is not None:  # a warm start needs no FLOPs lowering
            executable_cache.save_flops(plan.compilation_cache.dir, program.key, flops)
        # with the decoding program's (XLA's count on one device), None where either is unknown
        decoding = generator.decoder_flops
        flops = None if flops is None or decoding is None else flops + plan.num_devices * decoding
        if generator.cached and generator.denoiser_calls_skipped:  # a step cache skipped calls: count what ran
            saved = None if spec.hires else self.reuse.saved_per_skipped_call(
                program.prepared, spec.cache, spec.cache_shape, images * spec.calls_per_step, spec.height, spec.width,
                spec.prompt_tokens)
            flops = efficiency.executed_flops(flops, saved, generator.denoiser_calls, generator.denoiser_calls_skipped,
                                              spec.steps, plan.num_devices)
        devices = generator.devices
        peak = efficiency.peak_tflops(devices[0].device_kind, plan.dtype.activations_dtype.name,
                                      plan.peak_tflops_per_device)
        return dict(efficiency.summary(flops, seconds, plan.num_devices, peak),
                    device_memory_peak_bytes=efficiency.device_memory_peak(devices),
                    program_memory_bytes=generator.program_memory(),
                    host_peak_rss_bytes=efficiency.host_peak_rss())

    def counters(self) -> dict[str, int]:
        """What this process has loaded and compiled so far, and holds (sweeps read these)."""
        return {"process_model_loads": self.reuse.counters.model_loads,
                "process_compiles": self.reuse.counters.compiles, "process_models_held": len(self.reuse.models)}


def current() -> Engine:
    """This process's engine, made on first use (its state lives in :mod:`sdjax_runner.process`)."""
    state = process.current()
    if state.engine is None:
        state.engine = Engine()
    return state.engine


def executables_dir(plan: Plan) -> Optional[str]:
    """Where compiled programs are kept across processes (engine/executable_cache.py), or None.
    Multi-host programs are tied to their peers: neither kept nor loaded."""
    import jax

    cache = plan.compilation_cache
    return cache.dir if cache.enabled and cache.executables and jax.process_count() == 1 else None


def converted_note(formats: dict[str, str], variant: Optional[str] = None, variant_components=()) -> str:
    """`` (single-file checkpoint converted: text_encoder, unet, vae)``: weights that were not Flax files,
    and those read from ``variant``'s files (``; fp16 variant: unet, vae``)."""
    notes = {"safetensors": "PyTorch safetensors converted", "single_file": "single-file checkpoint converted",
             "pickle": "PyTorch pickle converted"}
    parts = [f"{notes[fmt]}: {', '.join(sorted(n for n, f in formats.items() if f == fmt))}"
             for fmt in notes if fmt in formats.values()]
    if variant_components:
        parts.append(f"{variant} variant: {', '.join(sorted(variant_components))}")
    return f" ({'; '.join(parts)})" if parts else ""


def image_size(plan: Plan, loaded: LoadedModel) -> tuple[int, int]:
    """The plan's height/width, defaulting to model.resolution, then to the size the model was
    configured for; checked against the model's down-sampling."""
    native = plan.model.resolution or loaded.native_size
    height, width = plan.height or native, plan.width or native
    checks.image_size(height, width, loaded.size_multiple, plan.model.name)
    if plan.hires is not None:  # Hires. fix's upscaled size, likewise
        hires.fits(plan.hires, height, width, loaded.size_multiple, plan.model.name)
    return height, width


SLOW_SIZE_ON_CPU = 4  # past this many times the model's native pixel count, a CPU run is said to be slow


def warn_slow_size(plan: Plan, loaded: LoadedModel, height: int, width: int, platform: str) -> None:
    """One line when a CPU is asked for far more pixels than the model's native size (an A1111 PNG's 512x768
    for the tiny model, say): the run will be slow, and the sampling.width/height of about the native size."""
    native = plan.model.resolution or loaded.native_size
    if platform != "cpu" or height * width <= SLOW_SIZE_ON_CPU * native * native:
        return
    multiple, scale = loaded.size_multiple, native / (height * width) ** 0.5
    fit_h, fit_w = (max(multiple, round(side * scale / multiple) * multiple) for side in (height, width))
    log.warning("size: %dx%d is %.0fx the pixels of %s's native %dx%d, on a CPU: this run will be slow; "
                "sampling.width=%d sampling.height=%d at the end of the command keeps its shape at about the "
                "native size", width, height, height * width / native ** 2, shown(plan.model.name), native, native,
                fit_w, fit_h)


def available_host_bytes() -> Optional[int]:
    """MemAvailable of /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def fits_host_memory(plan: Plan, generator: Generator, devices: list, height: int, width: int) -> None:
    """On CPU devices (which share the host's memory) a program whose own plan -- XLA's arguments, outputs and
    temporaries of each device, a lower bound of what it takes -- is more than the memory available is one line
    before it runs (a from_png of a large size on a small machine, say), not a machine that swaps or a process
    the kernel kills. Accelerators refuse such a program themselves when it is placed (out_of_memory_said)."""
    if not devices or devices[0].platform != "cpu":
        return
    per_device = generator.program_memory()
    available = available_host_bytes()
    if per_device is None or available is None or per_device * len(devices) <= available:
        return
    raise UserError("parallelism.per_device_batch_size", f"{height}x{width}, {plan.per_device_batch_size} image(s) "
                    f"per device on {len(devices)} CPU devices: the compiled program needs at least "
                    f"{per_device * len(devices) / 1e9:.1f} GB (XLA's plan), and this machine has "
                    f"{available / 1e9:.1f} GB available", "a smaller sampling.height/width, fewer images per device "
                    "or devices (parallelism.num_devices), dtype=bf16")


@contextlib.contextmanager
def out_of_memory_said(plan: Plan, height: int, width: int) -> Iterator[None]:
    """A program that runs out of device (or host) memory -- compiling, placing its inputs, generating -- ends
    in one line naming the size, the batch and what to lower, not XLA's RESOURCE_EXHAUSTED traceback; the run
    is FAILED with it (a UserError, raised where the job's failures are recorded)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        exhausted = isinstance(exc, MemoryError) or (type(exc).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
                                                     and ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text))
        if not exhausted:
            raise
        where = "the host" if isinstance(exc, MemoryError) else "the device"
        detail = one_line(text.split("\n")[0], 160) if text else type(exc).__name__
        raise UserError("parallelism.per_device_batch_size", f"{height}x{width}, {plan.per_device_batch_size} "
                        f"image(s) per device, dtype={plan.dtype.name}: {where} ran out of memory "
                        f"({detail})", "fewer images per device (parallelism.per_device_batch_size), a smaller "
                        "sampling.height/width, dtype=bf16, parallelism.params=sharded, or "
                        "performance.attention=cudnn_flash / memory_efficient") from None
