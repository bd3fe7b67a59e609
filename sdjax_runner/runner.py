"""One job: config -> plan -> model and params -> sharded batches -> images and timings
-> run directory -> tracker. Disk is written before the tracker is told anything, and
the tracker run is always ended (FINISHED, FAILED or KILLED)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from omegaconf import DictConfig
from PIL import Image

from sdjax_runner import attention, compile_cache, distributed, outputs, quiet
from sdjax_runner.errors import UserError, describe, stop_reason
from sdjax_runner.plan import Plan, make_plan
from sdjax_runner.tracking import NullTracker, flatten_params, make_tracker, numeric_metrics

log = logging.getLogger("sdjax_runner")
MAX_HOST_DEVICES = 512  # XLA makes every forced CPU device up front


def jax_started() -> bool:
    """Whether JAX has created its backends (after which XLA_FLAGS are not read again)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def use_host_devices(count: Optional[int]) -> None:
    """Split the CPU into ``count`` XLA devices; only possible before JAX initialises."""
    if not count:
        return
    if not 1 <= count <= MAX_HOST_DEVICES:
        raise UserError("parallelism.host_device_count", f"{count} CPU devices", f"1..{MAX_HOST_DEVICES} or null")
    if jax_started():
        import jax

        if jax.local_device_count("cpu") != count:
            log.warning("parallelism.host_device_count=%d ignored: JAX is already running with %d CPU devices",
                        count, jax.local_device_count("cpu"))
        return
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def check_xla_flags(flags: str) -> None:
    """Let XLA itself parse ``flags`` in a throwaway process: an unknown flag aborts the process that
    reads it, which must not be this one (it would die with a C++ log line and leave no record)."""
    import subprocess

    # XLA parses the flags (GPU ones too) whichever backend starts; the CPU one keeps the probe off the GPU.
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True,
                           env=dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu"), timeout=120)
    if probe.returncode:
        lines = [line for line in probe.stderr.splitlines() if "flag" in line.lower()] or probe.stderr.splitlines()[-1:]
        reason = lines[0].split("] ", 1)[-1] if lines else f"exit status {probe.returncode}"
        raise UserError("performance.xla_flags", f"XLA rejects them: {reason}",
                        "flags XLA knows, e.g. --xla_gpu_autotune_level=2")


def use_xla_settings(performance: DictConfig) -> None:
    """performance.* flags and GPU memory share, into the environment JAX reads when it starts."""
    flags = [str(flag) for flag in performance.xla_flags]
    if performance.gpu_autotune_level is not None:
        if not 0 <= performance.gpu_autotune_level <= 4:
            raise UserError("performance.gpu_autotune_level", f"{performance.gpu_autotune_level} is not a level", "0..4")
        flags.append(f"--xla_gpu_autotune_level={performance.gpu_autotune_level}")
    fraction = performance.gpu_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise UserError("performance.gpu_memory_fraction", f"{fraction} is not a fraction of the memory", "0 < x <= 1")
    if not flags and fraction is None:
        return
    if jax_started():
        log.warning("performance.xla_flags/gpu_* ignored: JAX's backend already started in this process "
                    "(in a multirun the first job's settings hold)")
        return
    if flags:
        combined = " ".join([os.environ.get("XLA_FLAGS", "")] + flags).strip()
        check_xla_flags(combined)
        os.environ["XLA_FLAGS"] = combined
    if performance.gpu_memory_fraction is not None:
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(performance.gpu_memory_fraction)


class Job:
    """status.json and the tracker run follow the job: RUNNING, then FINISHED/FAILED/KILLED.

    The tracker starts only once the config has passed validation, so bad input leaves no
    tracker run behind -- but status.json still says why the job stopped. What the tracker is
    to receive is written to tracking.json first; if the tracker fails (a server down), the job
    goes on, status.json says ``"logged": false``, and ``python -m sdjax_runner.sync`` logs it later.
    """

    def __init__(self, run_dir: Path, writes: bool = True):
        self.run_dir = run_dir
        self.writes = writes  # False on processes other than 0 of a multi-host run
        self.tracker: Any = NullTracker()
        self.tracker_error: Optional[str] = None
        self.status: dict[str, Any] = {"status": "RUNNING"}
        self.progress: dict[str, Any] = {}  # timings so far, kept if the job stops early
        self.records: list[dict] = []  # the images written so far

    def write_status(self, **fields: Any) -> None:
        self.status.update(fields, tracking=self.tracker.description, run_id=self.tracker.run_id)
        if isinstance(self.tracker, NullTracker):
            self.status["logged"] = None  # tracking=none: nothing to log
        else:
            self.status["logged"] = self.tracker_error is None and self.status["status"] != "RUNNING"
            if self.tracker_error:
                self.status["tracking_error"] = self.tracker_error
        if self.writes:
            outputs.write_json(self.run_dir / "status.json", self.status)

    def tracked(self, call: Callable[[], Any]) -> None:
        """A tracker call; the first failure is reported once and the tracker is left alone after."""
        if self.tracker_error is not None:
            return
        try:
            call()
        except Exception as exc:
            self.tracker_error = describe(exc) or f"{type(exc).__name__}: {exc}"
            log.warning("tracking failed, the run goes on and keeps everything in %s (log it later: "
                        "python -m sdjax_runner.sync %s): %s", self.run_dir, self.run_dir,
                        " ".join(self.tracker_error.split())[:300])

    def start_tracker(self, tracker, run_name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        self.tracker = tracker
        if self.writes and not isinstance(tracker, NullTracker):
            outputs.write_json(self.run_dir / "tracking.json", {"run_name": run_name, "params": params, "tags": tags})
        self.tracked(lambda: tracker.start(run_name, params, tags))
        self.write_status()

    def keep_partial(self) -> None:
        """A job stopped after it began generating: its timings so far (marked partial) and the
        records of the images it wrote, on disk and then to the tracker."""
        if not self.writes or not self.progress:
            return
        partial = dict(self.progress, partial=1)
        outputs.write_json(self.run_dir / "timings.json", partial)
        outputs.write_json(self.run_dir / "images.json", self.records)
        self.tracked(lambda: self.tracker.log_outputs(self.run_dir, numeric_metrics(partial)))

    def end_tracker(self, status: str, error: Optional[str] = None) -> None:
        self.tracked(lambda: self.tracker.end(status, error))
        self.write_status(status=status, **({"error": error} if error else {}))

    @contextlib.contextmanager
    def recorded(self) -> Iterator["Job"]:
        self.write_status()
        try:
            yield self
        except BaseException as exc:
            status, error = stop_reason(exc)
            self.keep_partial()
            self.end_tracker(status, error)
            if status == "FAILED" and "jax" in sys.modules:
                distributed.agree(failed=True)
            raise
        if distributed.agree(failed=False):
            error = "another process of this multi-host run failed"
            self.end_tracker("FAILED", error)
            raise RuntimeError(error)
        self.end_tracker("FINISHED")


def image_size(plan: Plan, loaded, model: DictConfig) -> tuple[int, int]:
    """The plan's height/width, defaulting to model.resolution, then to the size the UNet was
    configured for; checked against the model's down-sampling."""
    native = model.resolution or loaded.native_size
    height, width = plan.height or native, plan.width or native
    model_name = model.name
    for key, value in (("sampling.height", height), ("sampling.width", width)):
        if value % loaded.size_multiple:
            raise UserError(key, f"{value} does not fit {model_name}'s down-sampling",
                            f"multiples of {loaded.size_multiple}")
    return height, width


def write_batches(run_dir: Path, cfg: DictConfig, plan: Plan, batches: Iterator, meta: dict[str, Any],
                  records: list[dict]):
    """Each batch's kept images to images/ as it arrives, their records appended to ``records``
    (so an interruption keeps what was made, and says what it was)."""
    images, write_s = [], 0.0
    if cfg.output.save_images:
        (run_dir / "images").mkdir(exist_ok=True)
    for batch, pixels in enumerate(batches):
        started = time.perf_counter()
        slots = plan.images[batch * plan.images_per_batch:(batch + 1) * plan.images_per_batch]
        for slot, array in zip(slots, pixels):
            if not slot.kept:
                continue
            image = Image.fromarray(array)
            record = dict(meta, index=slot.index, batch=slot.batch, device=slot.device, prompt=slot.prompt,
                          file=f"images/{outputs.image_name(slot.index, plan.seed)}")
            if cfg.output.save_images:
                outputs.save_png(image, run_dir / record["file"], record)
            records.append(record)
            images.append(image)
        write_s += time.perf_counter() - started
    return images, write_s


def compile_generator(generator, prepared) -> tuple[float, float, bool]:
    """Give ``generator`` its compiled program, reused if this process has it; (trace_s, compile_s, cache hit)."""
    from sdjax_runner.session import SESSION

    if prepared.compiled is not None:
        generator.compiled = prepared.compiled
        log.info("compile: reused from an earlier job of this process")
        return 0.0, 0.0, False
    generator.compiled, trace_s, compile_s, cache_hit = SESSION.compile(prepared, generator.lower)
    log.info("compile: %.1f s (+ %.1f s tracing)%s", compile_s, trace_s,
             ", from the persistent compilation cache" if cache_hit else "")
    return trace_s, compile_s, cache_hit


def measure_efficiency(cfg: DictConfig, plan: Plan, prepared, generator, devices: list, height: int, width: int,
                       seconds: float) -> dict[str, Any]:
    """flops_per_batch, tflops_per_s, mfu and memory (see efficiency.py); None where not measurable."""
    from sdjax_runner import efficiency
    from sdjax_runner.session import SESSION

    flops = SESSION.flops(prepared, generator.compiled, plan.num_inference_steps, plan.per_device_batch_size,
                          height, width, plan.num_devices)
    peak = efficiency.peak_tflops(devices[0].device_kind, cfg.dtype.activations_dtype.name,
                                  cfg.performance.peak_tflops_per_device)
    return dict(efficiency.summary(flops, seconds, plan.num_devices, peak),
                device_memory_peak_bytes=efficiency.device_memory_peak(devices),
                program_memory_bytes=efficiency.program_memory(generator.compiled),
                host_peak_rss_bytes=efficiency.host_peak_rss())


def write_run_files(run_dir: Path, cfg: DictConfig, records: list[dict], images: list) -> float:
    """images.json and grid.png; returns the seconds it took."""
    started = time.perf_counter()
    outputs.write_json(run_dir / "images.json", records)
    if cfg.output.grid:
        rows, cols = outputs.grid_shape(len(images), cfg.output.grid_rows, cfg.output.grid_cols)
        outputs.make_grid(images, rows, cols).save(run_dir / "grid.png")
    return time.perf_counter() - started


def process_facts() -> dict[str, Any]:
    """The devices, and what this process has loaded and compiled so far (sweeps read these)."""
    from sdjax_runner.provenance import device_facts
    from sdjax_runner.session import SESSION

    facts = device_facts()
    return {
        "process_model_loads": SESSION.counters.model_loads,
        "process_compiles": SESSION.counters.compiles,
        "process_models_held": len(SESSION.models),
        "device_kind": facts["device_kind"],
        "backend": facts["backend"],
        "process_count": facts["process_count"],
    }


def warn_truncated(tokenizer, prompts: tuple[str, ...]) -> None:
    """CLIP reads model_max_length tokens (77 with start and end); say what a longer prompt loses."""
    limit = tokenizer.model_max_length
    unique = list(dict.fromkeys(prompts))
    for number, prompt in enumerate(unique, start=1):
        count = len(tokenizer(prompt, truncation=False).input_ids)
        if count > limit:
            kept = tokenizer.decode(tokenizer(prompt, truncation=True, max_length=limit).input_ids,
                                    skip_special_tokens=True)
            log.warning("prompt %d of %d has %d tokens; the text encoder reads %d, so the last %d are dropped "
                        "(it reads up to: ...%s)", number, len(unique), count, limit, count - limit, kept[-40:])


def image_meta(cfg: DictConfig, plan: Plan, height: int, width: int) -> dict[str, Any]:
    return {
        "negative_prompt": plan.negative,
        "seed": plan.seed,
        "steps": plan.num_inference_steps,
        "guidance_scale": plan.guidance_scale,
        "scheduler": cfg.scheduler.name,
        "model": cfg.model.name,
        "model_path": str(cfg.model.pretrained_model_name_or_path),
        "dtype": cfg.dtype.weights_dtype.name,
        "height": height,
        "width": width,
    }


def run(cfg: DictConfig, run_dir: Path, overrides: list[str], run_name: Optional[str] = None,
        parent_run_id: Optional[str] = None) -> dict[str, Any]:
    """Run one job into ``run_dir``; ``parent_run_id`` links its tracker run to a sweep's."""
    started = time.perf_counter()
    use_host_devices(cfg.parallelism.host_device_count)
    use_xla_settings(cfg.performance)
    distributed.initialize(cfg.parallelism)
    job = Job(run_dir, writes=distributed.is_writer())
    with job.recorded():
        return _run(cfg, job, overrides, run_name or cfg.run_name, parent_run_id, started)


def _run(cfg: DictConfig, job: Job, overrides: list[str], run_name: str, parent_run_id: Optional[str],
         started: float) -> dict[str, Any]:
    run_dir = job.run_dir
    quiet.silence_libraries()
    import jax

    plan = make_plan(cfg, jax.device_count() if cfg.parallelism.mode.name == "sharded" else jax.local_device_count())
    log.info("plan: %d image(s) = %d batch(es) x %d device(s) x %d per device; %s %s, %s %d steps, seed %d",
             len(plan.kept_images), plan.num_batches, plan.num_devices, plan.per_device_batch_size,
             cfg.model.name, cfg.dtype.name, cfg.scheduler.name, plan.num_inference_steps, plan.seed)
    attention.check(cfg.performance.attention.name, jax.devices()[0].platform, cfg.dtype.activations_dtype.name)
    if len(plan.kept_images) < len(plan.images):
        log.info("plan: %d padding image(s) will be generated and dropped (prompts.fill=pad)",
                 len(plan.images) - len(plan.kept_images))

    from sdjax_runner.generate import GENERATORS, compile_key
    from sdjax_runner.parallel import param_bytes_per_device
    from sdjax_runner.provenance import run_tags
    from sdjax_runner.session import SESSION

    tags = run_tags(overrides, cfg.experiment)
    tags["sdjax.run_uid"] = uuid.uuid4().hex  # lets sync find this run again instead of duplicating it
    tags["parallelism.layout"] = (f"{cfg.parallelism.mode.name}: {plan.num_devices} device(s) x "
                                  f"{plan.per_device_batch_size} per device over {jax.process_count()} process(es)")
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    job.start_tracker(make_tracker(cfg) if job.writes else NullTracker(), run_name, flatten_params(cfg), tags)
    compile_cache.configure(cfg.compilation_cache)

    entry, model_reused = SESSION.model(cfg)
    height, width = image_size(plan, entry.loaded, cfg.model)
    converted = sorted(name for name, fmt in entry.loaded.formats.items() if fmt != "flax")
    log.info("load: %s %s%s", cfg.model.name, "reused from an earlier job of this process" if model_reused else
             f"from {entry.loaded.path} in {entry.loaded.load_s:.1f} s",
             f" (PyTorch safetensors converted: {', '.join(converted)})" if converted and not model_reused else "")
    warn_truncated(entry.loaded.pipeline.tokenizer, plan.prompts)
    devices = jax.devices()[: plan.num_devices]
    prepared = SESSION.prepare(cfg, entry, model_reused, devices, compile_key(plan, height, width))
    generator = GENERATORS[cfg.parallelism.mode.name](prepared.pipeline, prepared.params, prepared.safety_params,
                                                      plan, height, width, devices)
    trace_s, compile_s, cache_hit = compile_generator(generator, prepared)
    job.progress.update(load_s=prepared.load_s, replicate_s=prepared.replicate_s, trace_s=trace_s,
                        compile_s=compile_s, batches_done=0, num_batches=plan.num_batches)

    def on_batch() -> None:
        bar.update()
        job.progress.update(batches_done=job.progress["batches_done"] + 1,
                            first_batch_s=generator.timings.first_batch_s, wall_s=time.perf_counter() - started)

    from tqdm import tqdm

    # The bar is closed however the loop ends, so an interrupt's message starts on a clean line.
    with tqdm(total=plan.num_batches, desc="generate", unit="batch", disable=plan.num_batches < 2,
              leave=False) as bar:
        batches = generator.generate(on_batch=on_batch)
        if not job.writes:  # still take part in every batch: gathering the images is collective
            for _ in batches:
                pass
            log.info("generate: done on process %d; process 0 writes the outputs", jax.process_index())
            return {"run_dir": None}
        records = job.records
        images, write_s = write_batches(run_dir, cfg, plan, batches, image_meta(cfg, plan, height, width), records)
    summary = generator.timings.summary(plan.images_per_batch, plan.num_inference_steps)
    summary.update(trace_s=trace_s, compile_s=compile_s)
    summary.update(measure_efficiency(cfg, plan, prepared, generator, devices, height, width, summary["generate_s"]))
    log.info("generate: %.3f s/batch median of %d (min %.3f, max %.3f), %.2f images/s%s",
             summary["generate_s"], summary["steady_state_samples"], summary["generate_s_min"],
             summary["generate_s_max"], summary["images_per_s"],
             (f", {summary['tflops_per_s']:.3g} TFLOP/s" if summary["tflops_per_s"] else "")
             + (f", MFU {summary['mfu']:.1%}" if summary["mfu"] is not None else ""))

    write_s += write_run_files(run_dir, cfg, records, images)
    timings = dict(
        summary,
        load_s=prepared.load_s,
        replicate_s=prepared.replicate_s,
        write_s=write_s,
        model_reused=int(model_reused),
        compile_reused=int(prepared.compiled is not None),
        compile_cache_hit=int(cache_hit),
        **process_facts(),
        num_images=len(records),
        images_per_batch=plan.images_per_batch,
        num_batches=plan.num_batches,
        num_devices=plan.num_devices,
        per_device_batch_size=plan.per_device_batch_size,
        param_bytes_per_device=param_bytes_per_device(entry.loaded.weights),
        wall_s=time.perf_counter() - started,
    )
    outputs.write_json(run_dir / "timings.json", timings)
    job.progress.clear()  # complete: nothing partial to keep any more
    log.info("write: %d image(s)%s to %s in %.2f s", len(records), " + grid" if cfg.output.grid else "",
             run_dir, write_s)
    job.tracked(lambda: job.tracker.log_outputs(run_dir, numeric_metrics(timings)))
    if job.tracker_error is None:
        log.info("track: %s", job.tracker.description)
    return {"run_dir": str(run_dir), "timings": timings}
