"""One job's lifecycle: config -> plan -> the engine (engine/engine.py: the model loaded and checked, its
weights placed, the program compiled) -> sharded batches, each written as it arrives -> timings and quality
-> run directory -> tracker. Disk is written before the tracker is told anything,
and the tracker run is always ended (FINISHED, FAILED or KILLED; see :mod:`.record.job`)."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import DictConfig

from sdjax_runner import interpreter, process
from sdjax_runner.config import checks
from sdjax_runner.config.guiders import GUIDERS
from sdjax_runner.config.plan import Plan, admit, check_values, make_plan
from sdjax_runner.config.quantizers import DEFAULT as QUANTIZE_DEFAULT
from sdjax_runner.config.quantizers import QUANTIZERS
from sdjax_runner.engine import compile_cache, distributed, runtime
from sdjax_runner.record import inputs, rundir
from sdjax_runner.record.job import Job
from sdjax_runner.record.provenance import environment
from sdjax_runner.record.tracking import NullTracker, make_tracker
from sdjax_runner.records import ImageRecord, Quality, RunTimings

if TYPE_CHECKING:
    from sdjax_runner.engine.engine import Engine

log = logging.getLogger("sdjax_runner")


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
    import jax  # JAX and the model libraries start here, once the config's values passed (check_values)

    from sdjax_runner.engine.efficiency import param_bytes_per_device
    from sdjax_runner.engine.engine import current as current_engine
    from sdjax_runner.engine.engine import out_of_memory_said

    announce(plan)
    if job.writes:
        rundir.write_json(job.run_dir / rundir.ENVIRONMENT, environment())
    job.start_tracker(make_tracker(plan.tracking, plan.output_root) if job.writes else NullTracker(), run_name,
                      plan.params, tags)
    engine = current_engine()
    engine.configure(plan)
    model = engine.load(plan, jax.devices()[0].platform)
    if job.writes:
        collected = inputs.collect(plan, model.loaded.path, tuple(model.loaded.formats))
        rundir.write_json(job.run_dir / rundir.INPUTS, collected)
    with out_of_memory_said(plan, model.height, model.width):  # one line, not XLA's RESOURCE_EXHAUSTED
        program = engine.program(plan, model, jax.devices()[: plan.num_devices], started)
        interpreter.program_ready()
        prepared = program.prepared
        job.progress.update(load_s=prepared.load_s, replicate_s=prepared.replicate_s, trace_s=program.facts.trace_s,
                            compile_s=program.facts.compile_s, batches_done=0, num_batches=plan.num_batches)
        images, write_s = generate_images(plan, job, program.generator, started)
        if images is None:
            return {"run_dir": None}
        facts = program.facts  # read after the first call: a stored executable that failed in it was traced then
        summary = measured(plan, engine, program)
        if plan.profile:
            profile(job, program.generator)
    quality = judge(plan, job, images)
    write_s += rundir.write_run_files(job.run_dir, plan, job.records, images)
    timings = RunTimings(
        **summary, load_s=prepared.load_s, replicate_s=prepared.replicate_s, write_s=write_s,
        model_reused=int(model.reused), compile_reused=int(prepared.compiled is not None),
        compile_cache_hit=int(facts.cache_hit), **process_facts(engine), num_images=len(job.records),
        images_per_batch=plan.images_per_batch, num_batches=plan.num_batches, num_devices=plan.num_devices,
        per_device_batch_size=plan.per_device_batch_size,
        param_bytes_per_device=param_bytes_per_device(prepared.entry.placed_weights),
        denoiser_param_bytes_per_device=param_bytes_per_device(prepared.entry.placed_weights[model.family.denoiser]),
        wall_s=time.perf_counter() - started)
    log.info("write: %d image(s)%s to %s in %.2f s", len(job.records), " + grid" if plan.output.grid else "",
             job.run_dir, write_s)
    job.finish(timings, quality)
    if job.tracker_error is None:
        log.info("track: %s", job.tracker.description)
    return {"run_dir": str(job.run_dir), "timings": timings.to_json(), "quality": quality.to_json()}


def measured(plan: Plan, engine: Engine, program: Any) -> dict[str, Any]:
    """The steady-state timings, how the program was got and the efficiency figures (``program``: the
    engine's Program, its batches run); said on the console in one line."""
    from sdjax_runner.engine.generate import describe

    steps = plan.num_inference_steps + (plan.hires.steps if plan.hires else 0)  # Hires. fix: both passes' steps
    summary = program.generator.timings.summary(plan.images_per_batch, steps)
    summary.update(program.facts.record())
    summary.update(engine.efficiency(plan, program, summary["generate_s"]))
    summary.update(cache_counts(program.generator))
    log.info("generate: %s%s", describe(summary, plan.repeats, plan.max_extra_share),
             (f", {summary['tflops_per_s']:.3g} TFLOP/s" if summary["tflops_per_s"] else "")
             + (f", MFU {summary['mfu']:.1%}" if summary["mfu"] is not None else ""))
    return summary


def cache_counts(generator: Any) -> dict[str, Any]:
    """A step cache's counts of the run's denoiser calls (none without a cache): the FLOPs figures beside them count
    what ran (Engine.efficiency)."""
    if not generator.cached:
        return {}
    return {"denoiser_calls": generator.denoiser_calls, "denoiser_calls_skipped": generator.denoiser_calls_skipped}


def announce(plan: Plan) -> None:
    """The plan's console line, and what can be said of it before anything loads."""
    import jax

    from sdjax_runner.config.prompts import hint_a1111_syntax, named_prompts

    log.info("plan: %d image(s) = %d batch(es) x %d device(s) x %d per device; %s %s, %s %d steps, seed %d%s",
             len(plan.kept_images), plan.num_batches, plan.num_devices, plan.per_device_batch_size,
             plan.model.name, plan.dtype.name, plan.sampling.label, plan.num_inference_steps, plan.seed,
             "".join(f"; {part}" for part in plan_extras(plan)))
    checks.attention(plan.attention, jax.devices()[0].platform, plan.dtype.activations_dtype.name)
    if plan.syntax == "plain":
        hint_a1111_syntax(named_prompts(plan.prompts, plan.prompt_names, plan.negative))
    if not plan.model.t5:
        log.info("plan: without T5 (model.t5=false): its part of the conditioning is zeros, as diffusers' "
                 "text_encoder_3=None")
    if len(plan.kept_images) < len(plan.images):
        log.info("plan: %d padding image(s) will be generated and dropped (prompts.fill=pad)",
                 len(plan.images) - len(plan.kept_images))


def plan_extras(plan: Plan) -> list[str]:
    """What the plan line adds where it applies: Hires. fix's second pass and its size, weights split across the
    devices, skip-layer guidance and its steps (each easy to miss, and each changing what a run costs), a guider
    other than classifier-free guidance with its settings."""
    from sdjax_runner.config.inert import skip_layer_steps

    extras = []
    if plan.hires is not None:
        size = (f" to {int(plan.height * plan.hires.scale)}x{int(plan.width * plan.hires.scale)}"
                if plan.height and plan.width else "")
        extras.append(f"Hires. fix x{plan.hires.scale:g}{size}, {plan.hires.steps} steps at strength "
                      f"{plan.hires.strength:g} ({plan.hires.upscaler})")
    if plan.params_placement == "sharded":
        extras.append(f"weights split across the {plan.num_devices} devices (parallelism.params=sharded)")
    if GUIDERS[plan.guider.name].skips:  # which steps it acts on, too
        settings = dict(plan.guider.settings)
        steps = skip_layer_steps(plan.num_inference_steps, settings["skip_start"], settings["skip_stop"])
        extras.append(f"guider {plan.guider.label}: skip-layer guidance on steps {steps[0]}..{steps[-1]}")
    elif not plan.guider.plain:
        extras.append(f"guider {plan.guider.label}")
    if not plan.cache.plain:
        extras.append(f"step cache {plan.cache.label}")
    if plan.quantize != QUANTIZE_DEFAULT:
        extras.append(f"quantize {plan.quantize}: {QUANTIZERS[plan.quantize].title}")
    return extras


def generate_images(plan: Plan, job: Job, generator: Any, started: float) -> tuple[Optional[list], float]:
    """Every batch, each batch's images written as it arrives: (the images, seconds writing); (None, 0) on a
    process that does not write (it still takes part in every batch: gathering the images is collective).
    The bar is closed however the loop ends, so an interrupt's message starts on a clean line."""
    import jax
    from tqdm import tqdm

    def on_batch() -> None:
        bar.update()
        job.progress.update(batches_done=job.progress["batches_done"] + 1,
                            first_batch_s=generator.timings.first_batch_s, wall_s=time.perf_counter() - started)

    with tqdm(total=plan.num_batches, desc="generate", unit="batch", disable=plan.num_batches < 2,
              leave=False) as bar:
        batches = generator.generate(on_batch=on_batch)
        if job.writes:
            from sdjax_runner.engine.families import FAMILIES

            family = FAMILIES[generator.spec.family]
            spec = generator.spec
            meta = rundir.image_meta(plan, generator.height, generator.width, family.guidance(generator.pipeline),
                                     family.shift(generator.pipeline),
                                     first_pass=(spec.height, spec.width) if spec.hires else None)
            return rundir.write_images(job.run_dir, plan, batches, meta, job.records, generator.non_finite)
        for _ in batches:
            pass
    if plan.profile:  # so is the profiled batch
        jax.block_until_ready(generator.run(*generator.inputs(0)))
    log.info("generate: done on process %d; process 0 writes the outputs", jax.process_index())
    return None, 0.0


def profile(job: Job, generator: Any) -> None:
    """One more batch under the profiler (performance.profile): its summary and trace in the run folder."""
    from sdjax_runner.engine import profiling

    summary = profiling.profile_batch(lambda: generator.run(*generator.inputs(0)), (generator.compiled,
                                      generator.decoder), job.run_dir / rundir.PROFILE_DIR)
    rundir.write_json(job.run_dir / rundir.PROFILE, summary)
    log.info("profile: %s; trace in %s", profiling.describe(summary), job.run_dir / rundir.PROFILE_DIR)


def judge(plan: Plan, job: Job, images: list) -> Quality:
    """The images' quality (metrics; never fails the run) and how many overflowed."""
    from sdjax_runner.engine.engine import executables_dir
    from sdjax_runner.metrics.evaluate import evaluate

    non_finite = warn_non_finite(job.records, plan.dtype.name)
    quality = evaluate(plan.metrics, job.run_dir, images, job.records, executables_dir(plan), rundir.image_records,
                       plan.syntax, plan.cache_dir)
    quality.non_finite_images = non_finite
    return quality


def warn_non_finite(records: list[ImageRecord], dtype: str) -> int:
    """How many images had NaN or infinite pixels (written as 0: black); said once."""
    count = sum(bool(record.non_finite) for record in records)
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
    if process.current().worker:
        tags["sdjax.worker"] = f"{process.current().worker} on {socket.gethostname()} (pid {os.getpid()})"
    return tags


def process_facts(engine: Engine) -> dict[str, Any]:
    """The devices, and what this process has loaded and compiled so far (sweeps read these)."""
    from sdjax_runner.record.provenance import device_facts

    facts = device_facts()
    return {**engine.counters(), "device_kind": facts["device_kind"], "backend": facts["backend"],
            "process_count": facts["process_count"], **worker_facts()}


def worker_facts() -> dict[str, Any]:
    """Where this job ran: the sweep worker's name (launchers/; None in the command's own process), host,
    process id and local devices."""
    import jax

    ids = sorted(device.id for device in jax.local_devices())
    span = f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1 else ",".join(map(str, ids))
    visible = [f"{key}={os.environ[key]}" for key in ("CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS") if os.environ.get(key)]
    return {"worker": process.current().worker, "host": socket.gethostname(), "pid": os.getpid(),
            "devices": f"{jax.default_backend()} {span}" + (f" ({', '.join(visible)})" if visible else "")}
