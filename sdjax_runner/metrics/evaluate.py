"""A job's quality metrics, after its images are on disk: CLIP score, PickScore (``metrics.pick_score.enabled``),
the aesthetic score (``metrics.aesthetic.enabled``), CMMD against a folder of real images (``metrics.cmmd.reference``)
and, with ``metrics.reference``, PSNR/SSIM against the reference run. Per-image values are added to the image records (images.json);
the run-level ones go to quality.json and the tracker. Nothing here fails the run: a metric that
cannot be computed is reported once and named in quality.json (``*_error``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.console import one_line
from sdjax_runner.records import ImageRecord, Quality, required

log = logging.getLogger("sdjax_runner")


def with_reference(run_dir: Path, records: list[ImageRecord], reference_dir: Path,
                   read_records: Callable[[Path], list[ImageRecord]]) -> Quality:
    """PSNR/SSIM of each record's image against ``reference_dir`` (the quality fields of the comparison);
    records gain ``psnr``/``ssim``."""
    from sdjax_runner.metrics.fidelity import compare

    try:
        per_image, fields = compare(run_dir, records, reference_dir, read_records(reference_dir))
    except Exception as exc:
        error = f"{type(exc).__name__}: {one_line(exc, 300)}"
        log.warning("metrics: no comparison with %s: %s", reference_dir, error)
        return Quality(reference=str(reference_dir), reference_error=error)
    for record, values in zip(records, per_image, strict=True):
        if values is not None:
            record.psnr, record.ssim = values.psnr, values.ssim
    compared = fields.compared_images or 0
    if compared < len(records):
        log.warning("metrics: %d of %d image(s) have no image of the same slot (index, seed, prompt, size) in %s",
                    len(records) - compared, len(records), reference_dir)
    return fields


def with_cmmd(metrics: Any, images: list, cache_dir: Optional[str]) -> Quality:
    """CMMD of ``images`` against metrics.cmmd.reference's folder (its embeddings kept under ``cache_dir``/cmmd/); a
    failure is a warning and ``cmmd_error``."""
    from sdjax_runner.metrics import cmmd

    model = str(metrics.cmmd.model or metrics.clip_score.model)
    try:
        found = cmmd.against_reference(images, model, str(metrics.cmmd.reference),
                                       Path(cache_dir).expanduser() if cache_dir else None)
    except Exception as exc:
        error = f"{type(exc).__name__}: {one_line(exc, 300)}"
        log.warning("metrics: no CMMD against %s: %s", metrics.cmmd.reference, error)
        return Quality(cmmd_reference=str(metrics.cmmd.reference), cmmd_model=model, cmmd_error=error)
    return Quality.from_json(found)


def scored(metrics: Any, images: list, records: list[ImageRecord], executables: Optional[str], syntax: str) -> Quality:
    """Every registry metric that metrics.<its group> turns on (metrics/registry.py), by its module's score_run; each
    record gains its value. Prompts are read once each, without A1111's syntax where ``syntax`` is a1111."""
    import importlib

    from sdjax_runner.config.prompt_syntax import plain_text
    from sdjax_runner.metrics.registry import METRICS

    on = [(m, getattr(metrics, m.group)) for m in METRICS.values() if m.group and getattr(metrics, m.group).enabled]
    quality = Quality()
    if not on or not records:
        return quality
    text = plain_text if syntax == "a1111" else str
    prompts = [required(r.prompt, "prompt") for r in records]
    read = {prompt: text(prompt) for prompt in dict.fromkeys(prompts)}  # once per prompt
    texts = [read[prompt] for prompt in prompts]
    for metric, settings in on:
        module = importlib.import_module("sdjax_runner." + metric.module.removesuffix(".py").replace("/", "."))
        values, found = module.score_run(settings, images, texts, executables)
        quality = quality.updated(found)
        if values is not None:
            for record, value in zip(records, values, strict=True):
                setattr(record, metric.name, float(value))
    return quality


def evaluate(metrics: Any, run_dir: Path, images: list, records: list[ImageRecord], executables: Optional[str],
             read_records: Callable[[Path], list[ImageRecord]], syntax: str = "plain",
             cache_dir: Optional[str] = None) -> Quality:
    """The run-level quality fields (and ``metrics_s``); ``records`` gain the per-image values.
    ``executables``: where compiled scoring programs are kept (a compilation_cache.dir), or None; ``cache_dir``:
    paths.cache_dir, where a CMMD reference folder's embeddings are kept;
    ``read_records``: reads the image records of a run directory (the reference's); ``syntax``:
    prompts.syntax -- with A1111's, CLIP scores an image against its prompt's text without the syntax
    (``a (red:1.3) car`` as ``a red car``)."""
    from sdjax_runner.metrics.registry import METRICS

    started = time.perf_counter()
    quality = scored(metrics, images, records, executables, syntax)
    if metrics.cmmd.enabled and metrics.cmmd.reference and images:
        quality = quality.updated(with_cmmd(metrics, images, cache_dir))
    if metrics.reference and records:
        if all((run_dir / required(r.file, "file")).exists() for r in records):
            quality = quality.updated(with_reference(run_dir, records, Path(metrics.reference).expanduser(),
                                                     read_records))
        else:
            log.warning("metrics: no comparison with %s: output.save_images=false left no images to compare",
                        metrics.reference)
            quality.reference, quality.reference_error = str(metrics.reference), "output.save_images=false"
    quality.metrics_s = time.perf_counter() - started
    # each metric of the registry that has a value, by its table label, then CMMD (a run-level comparison)
    said = [f"{label} {value:.4g}" for value, label in
            [*((getattr(quality, metric.run_field), metric.label) for metric in METRICS.values()),
             (quality.cmmd, "CMMD")]
            if value is not None]
    if said:
        log.info("metrics: %s (%.2f s)", ", ".join(said), quality.metrics_s)
    return quality
