"""The quality metrics, one entry each: what every reader of a run's quality takes from here -- the sweep summary's
columns (record/sweep.py), the report's table and plots (record/report_page.py, metrics/report.py), the judged
comparison (metrics/comparison.py), ``runs list``'s columns and the headline of a tracker run's description
(commands/runs.py, record/tracking.py, record/catalog.py), ``evaluate``'s paired metrics, and each image's PNG: its
per-image value as a text chunk and in the A1111 ``parameters`` line (``infotext``: record/rundir.py writes it once
the metrics are in; ``from_png`` reads it as a measurement, not a setting).

A metric is computed by its module (``module``) into the per-image field of each image record (images.json,
records.ImageRecord: ``name``) and the run-level fields of quality.json (records.Quality: ``run_field`` first,
then ``more_run_fields``); both record types declare those fields. Higher is better for every metric here
(``higher_is_better``); ``needs_reference``: computed against a reference run or the sweep's reference point
(metrics.reference, metrics.reference_point), so a reference's own images have none. ``cost`` is what one image
costs, measured (docs/benchmarks.md); ``group``: the config group that turns it on, whose settings its module's
``score_run`` takes (metrics/evaluate.py calls it). Adding a metric: its module, its entry here, its settings' group
in config/schema.py, its fields in records.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Metric:
    name: str  # the per-image field (images.json) and a setting's key in comparison.json
    module: str  # what computes it
    run_field: str  # quality.json's run-level value: the headline, the summary's and the report's column
    label: str  # how a table heads it ("CLIP score")
    short: str  # how a grid cell's caption names it ("CLIP")
    plot_label: str  # how a plot's axis names the run-level value ("CLIP score (mean)")
    setting_label: str  # how the judged comparison names the per-image value
    column: Optional[str]  # `runs list`'s column head; None: not listed there
    # The key of its per-image value in an image's A1111 ``parameters`` line ("CLIP score: 31.2"): letters, digits,
    # spaces, "-" and "/" only, the keys A1111's infotext parser reads.
    infotext: str
    more_run_fields: tuple[str, ...] = ()  # the other run-level fields, in the summary after run_field
    shown: str = "{:.4g}"  # how a value is printed
    higher_is_better: bool = True
    needs_reference: bool = False
    cost: str = ""
    # The metrics.<group> whose ``enabled`` turns it on; its module's ``score_run(group, images, texts, executables)``
    # computes it -> (a value per image or None, its run-level quality fields). None: computed otherwise (PSNR/SSIM,
    # against a reference).
    group: Optional[str] = None


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("clip_score", "metrics/clip_score.py", "clip_score_mean", "CLIP score", "CLIP", "CLIP score (mean)",
           "CLIP score",
           "clip", "CLIP score", ("clip_score_std",), group="clip_score",
           cost="0.008 s per sweep job on the tiny CLIP once loaded (docs/benchmarks.md, Quality metrics)"),
    Metric("pick_score", "metrics/pick_score.py", "pick_score_mean", "PickScore", "Pick", "PickScore (mean)",
           "PickScore", "pick", "PickScore", ("pick_score_std",), group="pick_score",
           cost="385 GFLOP per image at full size (CLIP ViT-H/14), 0.5% of an SD 1.x image (docs/benchmarks.md)"),
    Metric("aesthetic", "metrics/aesthetic.py", "aesthetic_mean", "Aesthetic score", "Aesth.", "Aesthetic score (mean)",
           "Aesthetic score", "aesth", "Aesthetic score", ("aesthetic_std",), group="aesthetic",
           cost="162 GFLOP per image at full size (CLIP ViT-L/14 image + MLP), 0.2% of an SD 1.x image"),
    Metric("psnr", "metrics/fidelity.py", "psnr", "PSNR (dB)", "PSNR", "PSNR to reference (dB)", "PSNR to reference (dB)",
           "psnr", "PSNR to reference dB", ("psnr_min",), needs_reference=True,
           cost="with SSIM, part of the 0.43 s of the smoke run's metrics (docs/benchmarks.md, Quality metrics)"),
    Metric("ssim", "metrics/fidelity.py", "ssim_mean", "SSIM", "SSIM", "SSIM to reference", "SSIM to reference", None,
           "SSIM to reference", ("ssim_min",), shown="{:.4f}", needs_reference=True, cost="with PSNR"),
)}


def per_image() -> tuple[str, ...]:
    """The per-image fields of every metric, in registry order."""
    return tuple(METRICS)


def run_fields() -> tuple[str, ...]:
    """Every run-level field of every metric, in registry order (each metric's headline first)."""
    return tuple(field for m in METRICS.values() for field in (m.run_field, *m.more_run_fields))
