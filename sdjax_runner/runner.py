"""One job: config -> plan -> model and host weights -> placed params -> compiled program -> sharded batches
-> images and timings -> run directory -> tracker. Disk is written before the tracker is told anything,
and the tracker run is always ended (FINISHED, FAILED or KILLED; see :mod:`.record.job`)."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from sdjax_runner import interpreter
from sdjax_runner.config import checks, modes
from sdjax_runner.config.plan import Plan, admit, check_values, make_plan
from sdjax_runner.engine import compile_cache, distributed, runtime
from sdjax_runner.models import checkpoints
from sdjax_runner.record import inputs, rundir
from sdjax_runner.record.job import Job
from sdjax_runner.record.provenance import environment
from sdjax_runner.record.tracking import NullTracker, make_tracker

log = logging.getLogger("sdjax_runner")


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


def run(cfg: DictConfig, run_dir: Path, overrides: list[str], run_name: Optional[str] = None,
        parent_run_id: Optional[str] = None, extra_tags: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Run one job into ``run_dir``; ``parent_run_id`` links its tracker run to a sweep's;
    ``extra_tags`` are added to its tracker run (a re-run names what it re-runs)."""
    started = time.perf_counter()
    interpreter.pause_collection()  # until the program is ready (see interpreter.py)
    config = None
    try:
        config = admit(cfg)  # the door: Hydra's config typed; nothing after it reads cfg
        runtime.prepare_process(config.parallelism, config.performance)
        job = Job(run_dir, writes=distributed.is_writer(), run_name=run_name)
        with job.recorded():
            checked = check_values(config)  # bad input: refused before JAX and the model libraries start
            runtime.silence_libraries()
            plan = make_plan(config, runtime.available_devices(config.parallelism.mode.name), checked)
            tags = dict(tracker_tags(plan, overrides, parent_run_id, run_dir), **(extra_tags or {}))
            return _run(plan, job, run_name or plan.run_name, tags, started)
    finally:
        if config is not None and compile_cache.configured():  # whatever this job added, the cache stays within its bound
            compile_cache.trim(config.compilation_cache)
        interpreter.job_ended()


def _run(plan: Plan, job: Job, run_name: str, tags: dict[str, str], started: float) -> dict[str, Any]:
    import jax
    from tqdm import tqdm

    from sdjax_runner.config.prompts import check_chunks, hint_a1111_syntax, named_prompts, warn_truncated
    from sdjax_runner.engine.generate import describe as describe_timings
    from sdjax_runner.engine.parallel import PARALLEL
    from sdjax_runner.engine.program import program_spec
    from sdjax_runner.engine.reuse import REUSE
    from sdjax_runner.engine.tokens import PromptTokens

    log.info("plan: %d image(s) = %d batch(es) x %d device(s) x %d per device; %s %s, %s %d steps, seed %d",
             len(plan.kept_images), plan.num_batches, plan.num_devices, plan.per_device_batch_size,
             plan.model.name, plan.dtype.name, plan.sampling.label, plan.num_inference_steps, plan.seed)
    checks.attention(plan.attention, jax.devices()[0].platform, plan.dtype.activations_dtype.name)
    if plan.syntax == "plain":
        hint_a1111_syntax(named_prompts(plan.prompts, plan.from_texts, plan.negative))
    if len(plan.kept_images) < len(plan.images):
        log.info("plan: %d padding image(s) will be generated and dropped (prompts.fill=pad)",
                 len(plan.images) - len(plan.kept_images))
    if job.writes:
        rundir.write_json(job.run_dir / rundir.ENVIRONMENT, environment())
    job.start_tracker(make_tracker(plan.tracking, plan.output_root) if job.writes else NullTracker(), run_name,
                      plan.params, tags)
    compile_cache.configure(plan.compilation_cache)
    checkpoints.SHAPES_DIR = (Path(plan.compilation_cache.dir).expanduser() / "shapes"
                              if plan.compilation_cache.enabled else None)

    # Load (or reuse) the model, place its weights and compile (or reuse) the generate function.
    entry, model_reused = REUSE.model(plan)
    loaded = entry.loaded
    height, width = image_size(plan, loaded)
    modes.fits_model(plan.generation, loaded.pipeline.unet.config.in_channels, plan.model.name)
    checks.clip_skip(plan.clip_skip, loaded.pipeline.text_encoder.config.num_hidden_layers,
                     hasattr(loaded.pipeline, "text_encoder_2"), plan.model.name)
    log.info("load: %s %s%s", plan.model.name, "reused from an earlier job of this process" if model_reused else
             f"from {loaded.path} in {loaded.load_s:.1f} s",
             "" if model_reused else converted_note(loaded.formats, plan.model.variant, loaded.variant_components))
    warn_slow_size(plan, loaded, height, width, jax.devices()[0].platform)
    if job.writes:
        rundir.write_json(job.run_dir / rundir.INPUTS, inputs.collect(plan, loaded.path))
    if plan.syntax == "plain":
        warn_truncated(loaded.pipeline.tokenizer, plan.prompts)
    devices = jax.devices()[: plan.num_devices]
    mode = PARALLEL[plan.mode]
    controlnet, controlnet_reused = REUSE.controlnet(plan, entry)
    if controlnet is not None:
        log.info("load: ControlNet %s", "reused from an earlier job of this process" if controlnet_reused else
                 f"from {controlnet.path} in {controlnet.load_s:.1f} s ({controlnet.format} weights)")
    tokens = PromptTokens(loaded.pipeline, plan.syntax)  # read once: for the chunk count, then the batches
    if plan.syntax == "a1111":  # before the program is made: its shape grows with the chunks
        check_chunks(named_prompts(plan.prompts, plan.from_texts, plan.negative), tokens.chunks_of)
    spec = program_spec(plan, loaded.pipeline, height, width, controlnet.structure if controlnet else "", tokens)
    if spec.prompt_chunks:
        log.info("prompts: A1111's syntax, %d chunk(s) of 75 tokens per prompt (the longest prompt's; shorter "
                 "ones padded with empty chunks)", spec.prompt_chunks)
    prepared = REUSE.prepare(plan, entry, model_reused, mode, devices, spec)
    generator = mode(prepared.pipeline, prepared.params, prepared.safety_weights, plan, spec, devices, tokens=tokens)
    generator.started = started  # its timing re-runs are weighed against the job's cost so far
    compiled = compile_generator(generator, prepared, plan)
    interpreter.program_ready()
    job.progress.update(load_s=prepared.load_s, replicate_s=prepared.replicate_s, trace_s=compiled["trace_s"],
                        compile_s=compiled["compile_s"], batches_done=0, num_batches=plan.num_batches)

    def on_batch() -> None:
        bar.update()
        job.progress.update(batches_done=job.progress["batches_done"] + 1,
                            first_batch_s=generator.timings.first_batch_s, wall_s=time.perf_counter() - started)

    # Generate, writing each batch's images as it arrives. The bar is closed however the loop ends,
    # so an interrupt's message starts on a clean line.
    with tqdm(total=plan.num_batches, desc="generate", unit="batch", disable=plan.num_batches < 2,
              leave=False) as bar:
        batches = generator.generate(on_batch=on_batch)
        if not job.writes:  # still take part in every batch: gathering the images is collective
            for _ in batches:
                pass
            if plan.profile:  # so is the profiled batch
                jax.block_until_ready(generator.run(*generator.inputs(0)))
            log.info("generate: done on process %d; process 0 writes the outputs", jax.process_index())
            return {"run_dir": None}
        images, write_s = rundir.write_images(job.run_dir, plan, batches, rundir.image_meta(plan, height, width),
                                              job.records, generator.non_finite)
    summary = generator.timings.summary(plan.images_per_batch, plan.num_inference_steps)
    summary.update(trace_s=compiled["trace_s"], compile_s=compiled["compile_s"],
                   compile_path=compiled["compile_path"],
                   executable_cache_hit=int(compiled["compile_path"] == "executable_cache"))
    summary.update(measure_efficiency(plan, prepared, generator, devices, height, width, summary["generate_s"]))
    log.info("generate: %s%s", describe_timings(summary, plan.repeats, plan.max_extra_share),
             (f", {summary['tflops_per_s']:.3g} TFLOP/s" if summary["tflops_per_s"] else "")
             + (f", MFU {summary['mfu']:.1%}" if summary["mfu"] is not None else ""))

    if plan.profile:
        from sdjax_runner.engine import profiling

        profile = profiling.profile_batch(lambda: generator.run(*generator.inputs(0)), generator.compiled,
                                          job.run_dir / rundir.PROFILE_DIR)
        rundir.write_json(job.run_dir / rundir.PROFILE, profile)
        log.info("profile: %s; trace in %s", profiling.describe(profile), job.run_dir / rundir.PROFILE_DIR)

    # Judge the images (never fails the run), then disk, then the tracker.
    from sdjax_runner.metrics.evaluate import evaluate

    non_finite = warn_non_finite(job.records, plan.dtype.name)
    quality = dict(evaluate(plan.metrics, job.run_dir, images, job.records, executables_dir(plan),
                            rundir.image_records, plan.syntax), non_finite_images=non_finite)
    write_s += rundir.write_run_files(job.run_dir, plan, job.records, images)
    from sdjax_runner.engine.efficiency import param_bytes_per_device

    timings = dict(
        summary, load_s=prepared.load_s, replicate_s=prepared.replicate_s, write_s=write_s,
        model_reused=int(model_reused), compile_reused=int(prepared.compiled is not None),
        compile_cache_hit=int(compiled["compile_cache_hit"]), **process_facts(), num_images=len(job.records),
        images_per_batch=plan.images_per_batch, num_batches=plan.num_batches, num_devices=plan.num_devices,
        per_device_batch_size=plan.per_device_batch_size,
        param_bytes_per_device=param_bytes_per_device(loaded.host_weights), wall_s=time.perf_counter() - started)
    log.info("write: %d image(s)%s to %s in %.2f s", len(job.records), " + grid" if plan.output.grid else "",
             job.run_dir, write_s)
    job.finish(timings, quality)
    if job.tracker_error is None:
        log.info("track: %s", job.tracker.description)
    return {"run_dir": str(job.run_dir), "timings": timings, "quality": quality}


def warn_non_finite(records: list[dict], dtype: str) -> int:
    """How many images had NaN or infinite pixels (written as 0: black); said once."""
    count = sum(record["non_finite"] for record in records)
    if count:
        log.warning("generate: %d of %d image(s) have NaN or infinite pixels (saved black there): the computation "
                    "overflowed%s", count, len(records), " -- fp16's range is small; try dtype=bf16 or fp32"
                    if dtype == "fp16" else " (a guidance scale or LoRA scale far too large?)")
    return count


def tracker_tags(plan: Plan, overrides: list[str], parent_run_id: Optional[str], run_dir: Path) -> dict[str, str]:
    import jax

    from sdjax_runner.record.provenance import run_note, run_tags

    tags = run_tags(overrides, plan.experiment)
    tags["mlflow.note.content"] = run_note(overrides, run_dir)
    tags["sdjax.run_uid"] = uuid.uuid4().hex  # lets sync find this run again instead of duplicating it
    tags["parallelism.layout"] = (f"{plan.mode}: {plan.num_devices} device(s) x "
                                  f"{plan.per_device_batch_size} per device over {jax.process_count()} process(es)")
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


def image_size(plan: Plan, loaded) -> tuple[int, int]:
    """The plan's height/width, defaulting to model.resolution, then to the size the UNet was
    configured for; checked against the model's down-sampling."""
    native = plan.model.resolution or loaded.native_size
    height, width = plan.height or native, plan.width or native
    checks.image_size(height, width, loaded.size_multiple, plan.model.name)
    return height, width


SLOW_SIZE_ON_CPU = 4  # past this many times the model's native pixel count, a CPU run is said to be slow


def warn_slow_size(plan: Plan, loaded, height: int, width: int, platform: str) -> None:
    """One line when a CPU is asked for far more pixels than the model's native size (an A1111 PNG's 512x768
    for the tiny model, say): the run will be slow, and the sampling.width/height of about the native size."""
    native = plan.model.resolution or loaded.native_size
    if platform != "cpu" or height * width <= SLOW_SIZE_ON_CPU * native * native:
        return
    multiple, scale = loaded.size_multiple, native / (height * width) ** 0.5
    fit_h, fit_w = (max(multiple, round(side * scale / multiple) * multiple) for side in (height, width))
    log.warning("size: %dx%d is %.0fx the pixels of %s's native %dx%d, on a CPU: this run will be slow; "
                "sampling.width=%d sampling.height=%d at the end of the command keeps its shape at about the "
                "native size", width, height, height * width / native ** 2, plan.model.name, native, native,
                fit_w, fit_h)


def executables_dir(plan: Plan) -> Optional[str]:
    """Where compiled programs are kept across processes (engine/executable_cache.py), or None.
    Multi-host programs are tied to their peers: neither kept nor loaded."""
    import jax

    cache = plan.compilation_cache
    return cache.dir if cache.enabled and cache.executables and jax.process_count() == 1 else None


def compile_generator(generator, prepared, plan: Plan) -> dict[str, Any]:
    """Give ``generator`` its compiled program: reused if this process has it, loaded if a stored
    executable fits, else traced and compiled (and stored). Returns trace_s, compile_s,
    compile_cache_hit (served by JAX's persistent cache) and compile_path ("reused",
    "executable_cache" or "traced"); a stored executable that fails at its first call is traced
    instead (``generator.retrace``), and these facts are updated then."""
    from sdjax_runner.engine import executable_cache
    from sdjax_runner.engine.reuse import REUSE

    if prepared.compiled is not None:
        generator.compiled = prepared.compiled
        log.info("compile: reused from an earlier job of this process")
        return {"trace_s": 0.0, "compile_s": 0.0, "compile_cache_hit": False, "compile_path": "reused"}
    cache = plan.compilation_cache
    started = time.perf_counter()
    if executables_dir(plan):
        generator.program_key = executable_cache.program_key(generator, generator.program_args())
        REUSE.know_flops(prepared, executable_cache.load_flops(cache.dir, generator.program_key))
        stored = executable_cache.load(cache.dir, generator.program_key, generator.devices, generator.program_args())
        if stored is not None:
            generator.compiled = stored
            REUSE.adopt(prepared, generator.compiled)
            load_s = time.perf_counter() - started
            log.info("compile: %.1f s, the stored executable (no tracing)", load_s)
            facts = {"trace_s": 0.0, "compile_s": load_s, "compile_cache_hit": False,
                     "compile_path": "executable_cache"}

            def retrace(error: Exception) -> None:
                log.warning("compile: the stored executable failed at its first call (%s); removed, tracing instead",
                            " ".join(str(error).split())[:160])
                executable_cache.discard(cache.dir, generator.program_key)
                facts.update(trace(generator, prepared), compile_path="traced")

            generator.retrace = retrace
            return facts
    return dict(trace(generator, prepared), compile_path="traced")


def trace(generator, prepared) -> dict[str, Any]:
    """Trace, lower and compile ``generator``'s program (and store it, see compile_generator)."""
    from sdjax_runner.engine import executable_cache
    from sdjax_runner.engine.reuse import REUSE

    log.info("compile: tracing and compiling the %d-step generate function ...", generator.plan.num_inference_steps)
    # A program to be stored is compiled afresh: one the persistent cache served does not reload.
    generator.compiled, trace_s, compile_s, cache_hit = REUSE.compile(prepared, generator.lower,
                                                                      fresh=bool(generator.program_key))
    log.info("compile: %.1f s (+ %.1f s tracing)%s", compile_s, trace_s,
             ", from the persistent compilation cache" if cache_hit else "")
    if generator.program_key and not cache_hit:
        executable_cache.save(generator.plan.compilation_cache.dir, generator.program_key, generator.compiled)
    return {"trace_s": trace_s, "compile_s": compile_s, "compile_cache_hit": cache_hit}


def measure_efficiency(plan: Plan, prepared, generator, devices: list, height: int, width: int,
                       seconds: float) -> dict[str, Any]:
    """flops_per_batch, tflops_per_s, mfu and memory (see engine/efficiency.py); None where not measurable."""
    from sdjax_runner.engine import efficiency
    from sdjax_runner.engine.reuse import REUSE

    flops = REUSE.flops(prepared, generator.compiled, plan.num_inference_steps, plan.per_device_batch_size,
                        height, width, plan.num_devices, generator.spec.prompt_tokens)
    if generator.program_key and flops is not None:  # a warm start needs no FLOPs lowering
        from sdjax_runner.engine import executable_cache

        executable_cache.save_flops(plan.compilation_cache.dir, generator.program_key, flops)
    peak = efficiency.peak_tflops(devices[0].device_kind, plan.dtype.activations_dtype.name,
                                  plan.peak_tflops_per_device)
    return dict(efficiency.summary(flops, seconds, plan.num_devices, peak),
                device_memory_peak_bytes=efficiency.device_memory_peak(devices),
                program_memory_bytes=efficiency.program_memory(generator.compiled),
                host_peak_rss_bytes=efficiency.host_peak_rss())


def process_facts() -> dict[str, Any]:
    """The devices, and what this process has loaded and compiled so far (sweeps read these)."""
    from sdjax_runner.engine.reuse import REUSE
    from sdjax_runner.record.provenance import device_facts

    facts = device_facts()
    return {
        "process_model_loads": REUSE.counters.model_loads,
        "process_compiles": REUSE.counters.compiles,
        "process_models_held": len(REUSE.models),
        "device_kind": facts["device_kind"],
        "backend": facts["backend"],
        "process_count": facts["process_count"],
    }
