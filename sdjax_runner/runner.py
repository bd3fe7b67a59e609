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
from pathlib import Path
from typing import Any, Iterator, Optional

from omegaconf import DictConfig
from PIL import Image

from sdjax_runner import outputs, quiet
from sdjax_runner.errors import UserError, describe
from sdjax_runner.plan import Plan, make_plan
from sdjax_runner.tracking import NullTracker, flatten_params, make_tracker, numeric_metrics

log = logging.getLogger("sdjax_runner")


def use_host_devices(count: Optional[int]) -> None:
    """Split the CPU into ``count`` XLA devices; only possible before JAX initialises."""
    if not count:
        return
    if "jax" in sys.modules:
        import jax

        if jax.local_device_count("cpu") != count:
            log.warning("parallelism.host_device_count=%d ignored: JAX is already running with %d CPU devices",
                        count, jax.local_device_count("cpu"))
        return
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


class Job:
    """status.json and the tracker run follow the job: RUNNING, then FINISHED/FAILED/KILLED.

    The tracker starts only once the config has passed validation, so bad input
    leaves no tracker run behind -- but status.json still says why the job stopped.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.tracker: Any = NullTracker()
        self.status: dict[str, Any] = {"status": "RUNNING"}

    def write_status(self, **fields: Any) -> None:
        self.status.update(fields, tracking=self.tracker.description)
        outputs.write_json(self.run_dir / "status.json", self.status)

    def start_tracker(self, tracker, run_name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        self.tracker = tracker
        tracker.start(run_name, params, tags)
        self.write_status()

    @contextlib.contextmanager
    def recorded(self) -> Iterator["Job"]:
        self.write_status()
        try:
            yield self
        except BaseException as exc:
            killed = isinstance(exc, (KeyboardInterrupt, SystemExit))
            self.write_status(status="KILLED" if killed else "FAILED",
                              error=describe(exc) or f"{type(exc).__name__}: {exc}")
            self.tracker.end(self.status["status"], self.status["error"])
            raise
        self.write_status(status="FINISHED")
        self.tracker.end("FINISHED")


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


def run(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    job = Job(run_dir)
    with job.recorded():
        return _run(cfg, job, overrides, started)


def _run(cfg: DictConfig, job: Job, overrides: list[str], started: float) -> dict[str, Any]:
    run_dir = job.run_dir
    use_host_devices(cfg.parallelism.host_device_count)
    quiet.silence_libraries()
    import jax

    plan = make_plan(cfg, jax.local_device_count())
    log.info("plan: %d image(s) = %d batch(es) x %d device(s) x %d per device; %s %s, %s %d steps, seed %d",
             len(plan.kept_images), plan.num_batches, plan.num_devices, plan.per_device_batch_size,
             cfg.model.name, cfg.dtype.name, cfg.scheduler.name, plan.num_inference_steps, plan.seed)
    if len(plan.kept_images) < len(plan.images):
        log.info("plan: %d padding image(s) will be generated and dropped (prompts.fill=pad)",
                 len(plan.images) - len(plan.kept_images))

    from sdjax_runner.provenance import device_facts, run_tags

    job.start_tracker(make_tracker(cfg), cfg.run_name, flatten_params(cfg), run_tags(overrides, cfg.experiment))
    from sdjax_runner.generate import PmapGenerator
    from sdjax_runner.loading import load_model
    from sdjax_runner.parallel import param_bytes_per_device

    model = load_model(cfg.model, cfg.dtype, cfg.scheduler)
    height, width = plan.height or model.native_size, plan.width or model.native_size
    for key, value in (("sampling.height", height), ("sampling.width", width)):
        if value % model.size_multiple:
            raise UserError(key, f"{value} does not fit {cfg.model.name}'s down-sampling",
                            f"multiples of {model.size_multiple}")
    log.info("load: %s from %s in %.1f s", cfg.model.name, cfg.model.pretrained_model_name_or_path,
             model.load_s)

    generator = PmapGenerator(model.pipeline, model.params, plan, height, width)
    meta = image_meta(cfg, plan, height, width)
    (run_dir / "images").mkdir(exist_ok=True)
    records, pil_images, write_s = [], [], 0.0
    from tqdm import tqdm

    def progress(batches):
        return tqdm(batches, total=plan.num_batches, desc="generate", unit="batch",
                    disable=plan.num_batches < 2, leave=False)

    for batch, pixels in enumerate(generator.generate(progress)):
        if batch == 0:
            log.info("compile: %.1f s (first batch %.2f s)", generator.timings.compile_s,
                     generator.timings.first_batch_s)
        write_started = time.perf_counter()
        slots = plan.images[batch * plan.images_per_batch:(batch + 1) * plan.images_per_batch]
        for slot, image in zip(slots, (Image.fromarray(p) for p in pixels)):
            if not slot.kept:
                continue
            record = dict(meta, index=slot.index, batch=slot.batch, device=slot.device, prompt=slot.prompt,
                          file=f"images/{outputs.image_name(slot.index, plan.seed)}")
            if cfg.output.save_images:
                outputs.save_png(image, run_dir / record["file"], record)
            records.append(record)
            pil_images.append(image)
        write_s += time.perf_counter() - write_started

    summary = generator.timings.summary(plan.images_per_batch, plan.num_inference_steps)
    log.info("generate: %.3f s/batch median of %d (min %.3f, max %.3f), %.2f images/s",
             summary["generate_s"], summary["steady_state_samples"], summary["generate_s_min"],
             summary["generate_s_max"], summary["images_per_s"])

    write_started = time.perf_counter()
    outputs.write_json(run_dir / "images.json", records)
    if cfg.output.grid:
        rows, cols = outputs.grid_shape(len(pil_images), cfg.output.grid_rows, cfg.output.grid_cols)
        outputs.make_grid(pil_images, rows, cols).save(run_dir / "grid.png")
    write_s += time.perf_counter() - write_started
    facts = device_facts()
    timings = dict(
        summary,
        load_s=model.load_s,
        write_s=write_s,
        num_images=len(records),
        images_per_batch=plan.images_per_batch,
        num_batches=plan.num_batches,
        num_devices=plan.num_devices,
        per_device_batch_size=plan.per_device_batch_size,
        param_bytes_per_device=param_bytes_per_device({k: v for k, v in model.params.items() if k != "safety_checker"}),
        device_kind=facts["device_kind"],
        backend=facts["backend"],
        process_count=facts["process_count"],
        wall_s=time.perf_counter() - started,
    )
    outputs.write_json(run_dir / "timings.json", timings)
    log.info("write: %d image(s)%s to %s in %.2f s", len(records), " + grid" if cfg.output.grid else "",
             run_dir, write_s)
    job.tracker.log_outputs(run_dir, numeric_metrics(timings))
    log.info("track: %s", job.tracker.description)
    return {"run_dir": str(run_dir), "timings": timings}
