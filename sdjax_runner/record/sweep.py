"""A multirun as one experiment: an MLflow parent run, a summary table and a contact sheet.

Hydra calls :class:`SweepCallback` in the launching process. At the start it opens the
parent run and writes ``sweep.json`` into the sweep directory; each job -- in this process
or another (joblib launcher) -- reads it to link its own run as a child and to name itself
after the values it sweeps. At the end the callback reads every job's directory, compares each
job's images with its reference point's (``metrics.reference_point``: PSNR/SSIM, written into the
job's images.json, its PNGs and quality.json and logged to its run), judges its settings (``comparison.json``:
metrics/comparison.py -- each metric's mean with its interval per setting, and each setting against the
baseline on the same seeds and prompts), writes ``summary.csv``, ``summary.json``, ``contact_sheet.png``,
``report.png`` and ``report.html`` beside them, logs them to the parent, and ends the parent
FAILED if any job failed (the command then exits 1).
"""

from __future__ import annotations

import csv
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sdjax_runner import process
from sdjax_runner.config.naming import override_value
from sdjax_runner.config.report_axes import axis_value
from sdjax_runner.console import one_line
from sdjax_runner.files import replaced
from sdjax_runner.metrics.registry import run_fields
from sdjax_runner.record import resume, rundir
from sdjax_runner.records import Quality

log = logging.getLogger("sdjax_runner")

# steady_calls: how many timed calls a point's generate_s rests on (0: its first call's, timing.max_extra_share).
SUMMARY_TIMINGS = ("compile_s", "trace_s", "first_batch_s", "generate_s", "steady_calls", "images_per_s", "mfu",
                   "model_reused", "compile_reused", "compile_cache_hit", "wall_s")
# gflops_per_image: XLA's count of what a point's program ran per image (flops_per_batch / images_per_batch, a step
# cache's skipped calls taken off): its cost where no steady state was timed (metrics/report.py).
SUMMARY_COST = ("gflops_per_image",)
SUMMARY_QUALITY = (*run_fields(), "non_finite_images")  # each metric's run-level fields (metrics/registry.py)
CELL = 256  # contact sheet cell width in pixels
MAX_CELL_HEIGHT = 4 * CELL  # a grid of 4 x 16 images; a 1 x 200000 grid.png does not make a sheet of gigapixels
# status.json's texts in a row: a status is one word (FINISHED, FAILED, KILLED, ...), an error a message
# (the page shows 200 characters), a run id MLflow's (32 hex digits) or a tracker's of the same form.
MAX_STATUS_CHARS, MAX_ERROR_CHARS = 40, 2000
RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")



def swept_keys(task_overrides: list[str]) -> list[str]:
    """The keys a multirun sweeps over (``seed=0,1,2`` -> ``seed``), in command-line order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(task_overrides)
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


def sweep_overrides(config: DictConfig) -> list[str]:
    """What a multirun sweeps over, as Hydra's basic sweeper combines it: an experiment's
    ``hydra.sweeper.params`` (``sampler: Euler,DPM++ 2M``), then the command line's overrides, which win."""
    task = list(config.hydra.overrides.task)
    given = {o.split("=", 1)[0].lstrip("+~") for o in task}
    params = config.hydra.sweeper.get("params") or {}
    return [f"{key}={value}" for key, value in params.items() if str(key).lstrip("+~") not in given] + task


def swept_values(task_overrides: list[str]) -> dict[str, list[str]]:
    """Each swept key's values as the command line means them (``seed=0,1`` -> ``{"seed": ["0", "1"]}``,
    ``'sampler=Euler a,DPM++ 2M'`` -> ``["Euler a", "DPM++ 2M"]``: naming.override_value's reading)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(task_overrides)
    return {o.get_key_element().lstrip("+~"): [override_value(f"{o.get_key_element()}={value}")
                                               for value in o.sweep_string_iterator()]
            for o in parsed if o.is_sweep_override()}


def sweep_size(task_overrides: list[str]) -> Optional[int]:
    """How many points the command line lists, or None where a sweeper samples them (an interval: Optuna's)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(task_overrides)
    if any(o.is_sweep_override() and not o.is_discrete_sweep() for o in parsed):
        return None
    return math.prod(len(values) for values in swept_values(task_overrides).values())


def override_values(job_overrides: list[str], short: bool = False) -> dict[str, str]:
    """``["+experiment=smoke", "sampler=Euler\\ a"]`` -> ``{"experiment": "smoke", "sampler": "Euler a"}``: each
    value as naming.override_value reads it (``short``: paths by their last part)."""
    return {o.split("=", 1)[0].lstrip("+~"): override_value(o, short) for o in job_overrides if "=" in o}


def job_label(job_overrides: list[str], keys: list[str]) -> str:
    """``seed=1 sampler=DPM++ 2M Karras``: the job's values of the swept keys, as a run name shows them."""
    values = override_values(job_overrides, short=True)
    return " ".join(f"{k}={values[k]}" for k in keys if k in values) or "job"


def read_sweep_file(sweep_dir: Path) -> dict[str, Any]:
    """sweep.json ({} where there is none), its lists of keys and overrides checked to be lists of texts:
    :class:`rundir.DamagedRecord` naming it otherwise."""
    path = sweep_dir / rundir.SWEEP
    if not path.exists():
        return {}
    record = rundir.read_record(path)
    for key in ("swept_keys", "overrides"):
        value = record.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise rundir.DamagedRecord(path, f"has {key} that is not a list of texts", f'"{key}": ["seed", ...]')
    if not isinstance(record.get("report", {}), (dict, type(None))):
        raise rundir.DamagedRecord(path, "has a report setting that is not an object", '"report": {"x": "seed"}')
    return record


def collect_jobs(sweep_dir: Path, keys: list[str]) -> list[dict[str, Any]]:
    """One row per job directory (``<sweep>/<job number>/``), in job order."""
    rows = []
    for job_dir in rundir.job_dirs(sweep_dir):
        overrides = rundir.job_overrides(job_dir) or []  # its .hydra/ removed or damaged: listed without its values
        # A record that is absent or damaged (a job killed early, a disk that filled up) is left blank.
        status = rundir.read_json_or_empty(job_dir / rundir.STATUS)
        timings, quality = rundir.read_timings(job_dir).to_json(), rundir.read_quality(job_dir).to_json()
        values = override_values(overrides)
        row = {"job": int(job_dir.name), "label": job_label(overrides, keys), **status_fields(status),
               "dir": str(job_dir)}
        row.update({k: axis_value(k, values[k]) if k in values else "" for k in keys})
        row.update({k: number_field(timings.get(k, "")) for k in SUMMARY_TIMINGS})
        row["gflops_per_image"] = gflops_per_image(timings)
        row.update({k: number_field(quality.get(k, "")) for k in SUMMARY_QUALITY})
        rows.append(row)
    return rows


def gflops_per_image(timings: dict[str, Any]) -> Any:
    """A point's executed GFLOPs per image from its timings.json (flops_per_batch / images_per_batch), as a summary
    field: a number, or blank where either is missing or not a finite positive number."""
    def positive(key: str) -> Optional[float]:
        value = number_field(timings.get(key, ""))
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        return float(value) if ok else None

    flops, images = positive("flops_per_batch"), positive("images_per_batch")
    return "" if flops is None or images is None else flops / images / 1e9


def status_fields(status: dict[str, Any]) -> dict[str, str]:
    """A row's ``status``, ``error`` and ``run_id`` from status.json, each the text it must be: a field of
    another type (a damaged or forged record: ``"status": 123``) is the status ``DAMAGED`` or a blank."""
    state, error, run_id = status.get("status", "UNKNOWN"), status.get("error", ""), status.get("run_id", "")
    experiment = status.get("experiment_id")
    return {"status": writable(state[:MAX_STATUS_CHARS]) if isinstance(state, str) and state else "DAMAGED",
            "error": writable(error[:MAX_ERROR_CHARS]) if isinstance(error, str) else "",
            "run_id": run_id if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else "",
            "experiment_id": experiment if isinstance(experiment, str) and RUN_ID.fullmatch(experiment) else ""}


def writable(text: str) -> str:
    """``text`` that UTF-8 can encode: a lone surrogate (JSON's ``"\\ud800"``) written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def number_field(value: Any) -> Any:
    """A timings or quality value as a row holds it: a number, a boolean, None, or "" (blank) for anything
    else -- a text, a list, an integer past a float's range."""
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int) and abs(value) < 2**1023:
        return value
    return ""


def contact_sheet(rows: list[dict[str, Any]], keys: list[str]):
    """Rows: the first swept key's values (or all but the last key's); columns: the last key's. A job's
    grid that cannot be read (damaged, a decompression bomb, ...) is a grey cell, and named in one warning."""
    from PIL import Image, ImageDraw, ImageFont

    from sdjax_runner.config.input_images import BadImage

    def axis(row, names):
        return " ".join(f"{k}={row[k]}" for k in names)

    row_keys, col_keys = (keys[:-1], keys[-1:]) if len(keys) > 1 else ([], keys)
    row_values = list(dict.fromkeys(axis(r, row_keys) for r in rows))
    col_values = list(dict.fromkeys(axis(r, col_keys) for r in rows))
    font = ImageFont.load_default()
    label_h = 16
    cells, unreadable = {}, []
    for r in rows:
        grid = Path(r["dir"]) / rundir.GRID
        if r["status"] == "FINISHED" and grid.is_file():
            try:
                cells[(axis(r, row_keys), axis(r, col_keys))] = sheet_cell(grid)
            except BadImage as bad:
                unreadable.append(f"job {r['job']}: {bad.problem}")
    if unreadable:
        log.warning("sweep: %d grid.png file(s) could not be read, grey on the contact sheet: %s", len(unreadable),
                    "; ".join(unreadable[:5]) + ("; ..." if len(unreadable) > 5 else ""))
    cell_h = max((c.height for c in cells.values()), default=CELL)
    sheet = Image.new("RGB", (CELL * len(col_values), (cell_h + label_h) * len(row_values)), "white")
    draw = ImageDraw.Draw(sheet)
    for r in rows:
        i, j = row_values.index(axis(r, row_keys)), col_values.index(axis(r, col_keys))
        x, y = j * CELL, i * (cell_h + label_h)
        draw.text((x + 3, y + 2), r["label"], fill="black", font=font)
        cell = cells.get((axis(r, row_keys), axis(r, col_keys)))
        if cell is not None:
            sheet.paste(cell, (x, y + label_h))
        else:
            draw.rectangle((x, y + label_h, x + CELL - 1, y + label_h + cell_h - 1), fill=(200, 200, 200))
            draw.text((x + 6, y + label_h + 6), r["status"], fill="red", font=font)
    return sheet


def sheet_cell(grid: Path):
    """A job's grid image at the contact sheet's cell width, :data:`CELL`, and at most :data:`MAX_CELL_HEIGHT`
    tall (a taller, thinner one fitted inside that); :class:`BadImage` where it cannot be read (input_images'
    bounds: a decompression bomb, a damaged file, text chunks past Pillow's limits)."""
    from sdjax_runner.config.input_images import BadImage, decoded, image_file_bytes

    picture = decoded(image_file_bytes(grid))
    height = max(1, round(picture.height * CELL / picture.width))
    size = (CELL, height) if height <= MAX_CELL_HEIGHT else \
        (max(1, round(picture.width * MAX_CELL_HEIGHT / picture.height)), MAX_CELL_HEIGHT)
    try:
        return picture.convert("RGB").resize(size)
    except Exception as exc:  # a mode Pillow decodes but cannot convert
        raise BadImage(f"cannot be shown ({one_line(exc, 120)})", "an RGB or grayscale image") from None


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]], keys: list[str],
                  reference_point: Optional[dict[str, str]] = None, report: Optional[dict[str, Any]] = None,
                  overrides: Optional[list[str]] = None, config: Any = None) -> None:
    """summary.csv/.json, comparison.json, contact_sheet.png, report.png and report.html (``report``: the sweep's
    report.x / report.y / report.image, checked when it started; ``config``: the sweep's, for metrics.cmmd)."""
    from sdjax_runner.config.report_axes import choose, image_index
    from sdjax_runner.metrics.report import write_report
    from sdjax_runner.record.report_page import mlflow_ui_of, write_page

    columns = ["job", "label", *keys, "status", "error", *SUMMARY_TIMINGS, *SUMMARY_COST, *SUMMARY_QUALITY, "run_id", "experiment_id",
               "dir"]
    with replaced(sweep_dir / rundir.SUMMARY_CSV, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    rundir.write_json(sweep_dir / rundir.SUMMARY_JSON, rows)
    judged = judge_settings(sweep_dir, rows, keys, reference_point, config)
    if rows:
        drawn(sweep_dir / rundir.CONTACT_SHEET, lambda file: contact_sheet(rows, keys).save(file, format="PNG"))
        drawn(sweep_dir / rundir.REPORT, lambda file: write_report(
            file, [r for r in rows if r["status"] == "FINISHED"], keys, reference_point))
    report = report or {}
    write_page(sweep_dir, rows, keys, choose(keys, report.get("x"), report.get("y")), image_index(report.get("image")),
               reference_point, overrides, mlflow_ui_of(rows), judged)


def judge_settings(sweep_dir: Path, rows: list[dict[str, Any]], keys: list[str],
                   reference_point: Optional[dict[str, str]], config: Any = None) -> Optional[dict[str, Any]]:
    """comparison.json: the finished points' settings judged (metrics/comparison.py), with CMMD where
    ``config.metrics.cmmd`` asks for it (else as an earlier comparison.json of the same settings had it: the report
    command makes the file again without the sweep's config), or None where it could not be made (a warning; the
    rest of the summary is still written)."""
    from sdjax_runner.metrics.comparison import baseline_of, compare, settings_of

    try:
        points = [(row["job"], {k: str(row.get(k, "")) for k in keys}, rundir.image_records(Path(row["dir"])),
                   row["dir"]) for row in rows if row["status"] == "FINISHED"]
        settings = settings_of(points, keys)
        baseline, chosen_by = baseline_of(settings, reference_point)
        judged = compare(settings, baseline, chosen_by)
        if config is not None and config.metrics.cmmd.enabled:
            with_cmmd(judged, settings, baseline, config)
        else:
            keep_cmmd(judged, rundir.read_json_or_empty(sweep_dir / rundir.COMPARISON))
        rundir.write_json(sweep_dir / rundir.COMPARISON, judged)
        return judged
    except Exception as exc:  # a damaged record: the table and the pictures are still written
        (sweep_dir / rundir.COMPARISON).unlink(missing_ok=True)
        log.warning("sweep: %s was not written (%s: %s)", rundir.COMPARISON, type(exc).__name__, one_line(exc, 200))
        return None


def with_cmmd(judged: dict[str, Any], settings: list, baseline: int, config: Any) -> None:
    """comparison.json's CMMD (metrics/cmmd.py: judge_settings); a failure is a warning and ``cmmd_error``."""
    from sdjax_runner.metrics import cmmd

    metrics = config.metrics
    model = str(metrics.cmmd.model or metrics.clip_score.model)
    try:
        found = cmmd.judge_settings([s.files for s in settings], baseline, model, metrics.cmmd.reference,
                                    Path(config.paths.cache_dir).expanduser())
    except Exception as exc:
        judged["cmmd_error"] = f"{type(exc).__name__}: {one_line(exc, 300)}"
        log.warning("sweep: no CMMD (metrics.cmmd): %s", judged["cmmd_error"])
        return
    for setting, entry in zip(judged["settings"], found.pop("settings"), strict=True):
        setting["cmmd"] = entry
    judged["cmmd"] = found
    log.info("sweep: CMMD of %d setting(s) with %s%s", len(settings), model,
             f" and against {found['reference_images']} image(s) of {metrics.cmmd.reference}"
             if found["reference_images"] else "")


def keep_cmmd(judged: dict[str, Any], earlier: dict[str, Any]) -> None:
    """An earlier comparison.json's CMMD, where it judged the same settings against the same baseline."""
    old: list = earlier["settings"] if isinstance(earlier.get("settings"), list) else []
    if not isinstance(earlier.get("cmmd"), dict) or earlier.get("baseline") != judged["baseline"] \
            or [s.get("label") for s in old if isinstance(s, dict)] != [s["label"] for s in judged["settings"]]:
        return
    for setting, before in zip(judged["settings"], old, strict=True):
        if isinstance(before.get("cmmd"), dict):
            setting["cmmd"] = before["cmmd"]
    judged["cmmd"] = earlier["cmmd"]


class _NothingDrawn(Exception):
    pass


def drawn(path: Path, draw: Callable[[IO[bytes]], Any]) -> None:
    """``draw(file)`` into a file that replaces ``path`` whole (files.replaced), unless it returns False (nothing
    to draw); a failure (what the sweep's records hold that a picture cannot show) costs only that picture: a
    warning naming it, nothing half-drawn left behind, and the summary and report.html are still written."""
    try:
        with replaced(path) as file:
            if draw(file) is False:
                raise _NothingDrawn
    except _NothingDrawn:
        pass
    except Exception as exc:
        path.unlink(missing_ok=True)  # no earlier picture left beside the new records (a link: itself removed)
        log.warning("sweep: %s was not drawn (%s: %s)", path.name, type(exc).__name__, one_line(exc, 200))


class SweepCallback(Callback):
    def __init__(self) -> None:
        self.tracker: Any = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from sdjax_runner.config.launchers import check_launcher
        from sdjax_runner.config.messages import describe
        from sdjax_runner.config.sweep_points import check_points
        from sdjax_runner.errors import Refused
        from sdjax_runner.record.provenance import run_tags
        from sdjax_runner.record.tracking import make_tracker

        process.current().sweep_result.clear()  # what it ends with: failures make the exit status 1
        task = sweep_overrides(config)
        keys = swept_keys(task)
        point = None
        try:  # bad input: refused before anything runs or is written
            check_points(config, task)  # (an interval is refused there: swept_values cannot list one)
            check_launcher(config, sweep_size(task))  # this package's launchers: their settings, a Ray address that does not answer
            report_choice(config, keys)
            if config.metrics.reference_point:
                from sdjax_runner.config.checks import reference_point

                point = reference_point(dict(config.metrics.reference_point), swept_values(task))
        except Exception as exc:
            message = describe(exc)
            if message is not None:
                from sdjax_runner.record.fresh_dirs import release

                release(Path(config.hydra.sweep.dir))  # nothing was written: no directory either
                raise Refused(message) from None
            # Not bad input but a failure of the check itself: the sweep starts, each job checks its own values.
            log.warning("sweep: the points were not checked before the start (%s: %s)", type(exc).__name__,
                        one_line(exc, 200))
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        earlier = read_sweep_file(sweep_dir) if resume.resuming(config) else {}
        self.tracker = make_tracker(config.tracking, config.paths.output_root)
        try:
            if earlier.get("parent_run_id"):  # a resumed sweep: its jobs join the parent run it had
                self.tracker.reopen(earlier["parent_run_id"])
            else:
                self.tracker.start(f"{config.run_name} sweep", {"sweep.overrides": " ".join(task)[:500],
                                                              "sweep.keys": " ".join(keys)},
                                   run_tags(task, config.experiment, with_devices=False))
        except Exception as exc:  # the jobs still run and keep everything on disk
            log.warning("sweep: tracking failed, no parent run (%s)", one_line(exc, 200))
            self.tracker = None
        process.current().open_sweep_parent[:] = [self.tracker] if self.tracker else []  # ended on an interrupt
        # Without a tracker now, a resumed sweep keeps its parent's id for sync to finish later.
        parent = self.tracker.run_id if self.tracker else earlier.get("parent_run_id")
        if earlier:
            earlier["resumed_at"] = resume.resumed_at(earlier)
        rundir.write_json(sweep_dir / rundir.SWEEP, dict(
            earlier, parent_run_id=parent, parent_logged=False if parent else None, swept_keys=keys, overrides=task,
            reference_point=point, report=report_choice(config, keys)))
        log.info("sweep: over %s -> %s%s", ", ".join(keys) or "nothing", sweep_dir,
                 f"; {self.tracker.description}" if self.tracker else "")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        record = read_sweep_file(sweep_dir)
        keys = record.get("swept_keys", [])
        rows = collect_jobs(sweep_dir, keys)
        if record.get("reference_point"):
            compare_with_reference_point(sweep_dir, rows, keys, record["reference_point"], config)
            rows = collect_jobs(sweep_dir, keys)
        write_summary(sweep_dir, rows, keys, record.get("reference_point"), record.get("report"),
                      record.get("overrides"), config)  # disk first
        failed = [r for r in rows if r["status"] != "FINISHED"]
        process.current().sweep_result.update(jobs=len(rows), failed=failed, sweep_dir=str(sweep_dir))
        process.current().open_sweep_parent.clear()
        if self.tracker is not None:
            try:
                log_parent(self.tracker, sweep_dir, rows)
            except Exception as exc:  # everything is on disk; sync logs it later
                log.warning("sweep: tracking failed for the parent run, the sweep keeps everything in %s (log it "
                            "later: python -m sdjax_runner sync %s): %s", sweep_dir, sweep_dir,
                            one_line(exc, 200))
        log.info("sweep: %d job(s), %d failed; report.html, summary.csv and contact_sheet.png in %s", len(rows),
                 len(failed), sweep_dir)


def report_choice(config: DictConfig, keys: list[str]) -> dict[str, Any]:
    """The sweep's report settings, its axes checked against the swept keys (one line naming report.x or
    report.y when one is not swept)."""
    from sdjax_runner.config.report_axes import choose, image_index

    report = config.get("report") or {}
    choose(keys, report.get("x"), report.get("y"))
    return {"x": report.get("x"), "y": report.get("y"), "image": image_index(report.get("image"))}


def reference_of(row: dict[str, Any], rows: list[dict[str, Any]], keys: list[str],
                 point: dict[str, str]) -> Optional[dict[str, Any]]:
    """The job with ``row``'s values of the swept keys, but the reference point's where it names them."""
    wanted = {k: axis_value(k, str(point[k])) if k in point else str(row[k]) for k in keys}
    return next((r for r in rows if all(str(r[k]) == v for k, v in wanted.items())), None)


def compare_with_reference_point(sweep_dir: Path, rows: list[dict[str, Any]], keys: list[str],
                                 point: dict[str, str], config: DictConfig) -> None:
    """Each finished job's images against its reference job's: per image into its images.json, per run
    into its quality.json (disk first), then to its tracker run. A failure is logged, never raised."""
    from sdjax_runner.metrics.evaluate import with_reference
    from sdjax_runner.record.tracking import NullTracker, make_tracker, numeric_metrics

    for row in rows:
        reference = reference_of(row, rows, keys, point)
        if row["status"] != "FINISHED" or reference is None or reference is row:
            continue
        if reference["status"] != "FINISHED":
            log.warning("sweep: job %s has no reference images (job %s is %s)", row["label"], reference["label"],
                        reference["status"])
            continue
        job_dir, reference_dir = Path(row["dir"]), Path(reference["dir"])
        records = rundir.image_records(job_dir)
        fields = with_reference(job_dir, records, reference_dir, rundir.image_records)
        fields.reference_label = reference["label"]
        quality_file = job_dir / rundir.QUALITY
        quality = Quality.from_json(rundir.read_json(quality_file)) if quality_file.exists() else Quality()
        rundir.write_image_records(job_dir, records)
        rundir.stamp_measurements(job_dir, records)
        rundir.write_json(quality_file, quality.updated(fields).to_json())
        tracker = make_tracker(config.tracking, config.paths.output_root)
        if row["run_id"] and not isinstance(tracker, NullTracker):
            try:
                tracker.resume(row["run_id"])
                tracker.log_quality(job_dir, numeric_metrics(fields.to_json()))
            except Exception as exc:  # on disk already; the summary and report still have it
                log.warning("sweep: tracking failed for job %s's comparison: %s", row["label"],
                            one_line(exc, 200))


def log_parent(tracker: Any, sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    """The parent run's summary, contact sheet and final status; sweep.json records that it is logged."""
    failed = [r for r in rows if r["status"] != "FINISHED"]
    tracker.log_sweep(sweep_dir, rows, {"jobs": len(rows), "failed_jobs": len(failed)})
    tracker.end("FAILED" if failed else "FINISHED", f"{len(failed)} of {len(rows)} job(s) failed" if failed else None)
    record = read_sweep_file(sweep_dir)
    rundir.write_json(sweep_dir / rundir.SWEEP, dict(record, parent_logged=True))


def abort(reason: str, status: str = "KILLED") -> None:
    """End the parent run of a sweep cut short: KILLED when interrupted, FAILED when it broke off."""
    parents = process.current().open_sweep_parent
    while parents:
        parents.pop().end(status, reason)


def failure_message() -> Optional[str]:
    last_result = process.current().sweep_result
    if not last_result.get("failed"):
        return None
    failed = last_result["failed"]
    names = "; ".join(f"#{r['job']} {r['label']}: {r['error'] or r['status']}" for r in failed[:3])
    return (f"sweep: {len(failed)} of {last_result['jobs']} job(s) failed ({names}); "
            f"see {last_result['sweep_dir']}/summary.csv")
