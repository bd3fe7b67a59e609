"""A sweep's ``report.html``: one self-contained page a person reads in a browser.

* **Grid** -- A1111's X/Y/Z plot: one cell per point, x and y two swept keys (``report.x``/``report.y``,
  or chosen: config/report_axes.py), one grid per combination of the other swept keys' values (Z). A
  cell is a thumbnail of one of the point's images (``report.image``), embedded; a click opens that image
  at full size, and its caption links to the point's image grid. A point that did not finish is a grey
  cell saying its status.
* **Points** -- a table of every point: swept values, status, seconds per image, MFU, CLIP score,
  PSNR/SSIM to the reference point (``reference`` in the reference point's own rows), non-finite images,
  its run directory and MLflow run; a click on a column's header sorts by it.
* **Settings compared** -- comparison.json (metrics/comparison.py): per setting (the points that share every
  swept value but the seed's and the prompts'), each per-image metric's mean with its 95% interval and n, and
  its paired difference from the baseline setting on the same seeds and prompts with its interval and win rate;
  a difference whose interval holds 0 is said to be none told apart. The same as plots: each setting's mean
  with its interval as an error bar against its seconds per image, the Pareto front over settings marked.
* **Quality and cost** -- metrics/report.py's plots as inline SVG: each quality metric against seconds
  per image with the Pareto front marked, and against each numeric swept key.

Nothing is fetched: the styles, the sorting script, the plots and the thumbnails are in the file, and
the links are relative (the run directories of the sweep's points), so it opens from ``file://``, from a
copy of the sweep directory and as an MLflow artifact (where the run-directory links go nowhere).
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, cast

from sdjax_runner import console
from sdjax_runner.config.input_images import BadImage, decoded, image_file_bytes
from sdjax_runner.config.report_axes import Axes, axis_value
from sdjax_runner.files import write_text
from sdjax_runner.metrics.registry import METRICS
from sdjax_runner.metrics.report import (
    first_call_only,
    front_seconds,
    gflops,
    number,
    pareto_front,
    replicated,
    seconds_per_image,
    settings_plots,
    svg_plots,
)
from sdjax_runner.record import rundir
from sdjax_runner.record.tracking import ui_link

log = logging.getLogger("sdjax_runner")

PAGE = rundir.REPORT_PAGE
THUMBNAIL = 192  # px, the longer side of a grid cell's image
# The table's columns after the swept keys: (row key, header, how a value is shown).
NUMBERS = (("seconds_per_image", "s / image", "{:.4g}"), ("mfu", "MFU", "{:.1%}"),
           *((m.run_field, m.label, m.shown) for m in METRICS.values()),
           ("non_finite_images", "non-finite images", "{:.0f}"))
# what the reference point's own rows say "reference" in
REFERENCE_METRICS = tuple(m.run_field for m in METRICS.values() if m.needs_reference)

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; margin: 0 0 .3em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #555; margin: .2em 0; } code { background: #f3f3f3; padding: 0 .25em; }
nav a { margin-right: 1em; }
table.grid { border-collapse: collapse; margin: .5em 0 1.5em; }
table.grid th { font-weight: 600; padding: 4px 8px; background: #f6f6f6; }
table.grid td.cell { padding: 4px; text-align: center; vertical-align: top; border: 1px solid #e3e3e3; }
table.grid img { display: block; margin: 0 auto; max-width: 192px; max-height: 192px; }
td.missing { background: #ddd; color: #a00; width: 192px; height: 120px; }
.caption { font-size: 11px; color: #444; }
table.points { border-collapse: collapse; font-size: 13px; }
table.points th, table.points td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
table.points td.text, table.points th.text { text-align: left; }
table.points th { background: #f0f0f0; cursor: pointer; user-select: none; position: sticky; top: 0; }
table.points th[aria-sort=ascending]::after { content: " \\25B2"; }
table.points th[aria-sort=descending]::after { content: " \\25BC"; }
tr.failed td { color: #a00; } tr.pareto td:first-child { font-weight: bold; }
td.reference { color: #555; font-style: italic; text-align: center; }
table.settings { border-collapse: collapse; font-size: 13px; margin: .4em 0 1.2em; }
table.settings th, table.settings td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
table.settings td.text, table.settings th.text { text-align: left; } table.settings th { background: #f0f0f0; }
tr.baseline td { background: #f2f8f2; } td.holds-zero { color: #777; }
figure { display: inline-block; margin: 0 1.5em 1.5em 0; vertical-align: top; }
figure svg { max-width: 520px; height: auto; } figcaption { font-size: 12px; color: #444; max-width: 520px; }
"""

# Sorting the points table: a click on a header sorts by its column (numbers by value, blanks last),
# a second click reverses.
SCRIPT = """
document.querySelectorAll("table.points th").forEach(function (header, column) {
  header.addEventListener("click", function () {
    var table = header.closest("table"), body = table.tBodies[0];
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var numeric = header.dataset.type === "number";
    var rows = Array.prototype.slice.call(body.rows);
    function key(row) {
      var cell = row.cells[column], raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent;
      return numeric ? (raw === "" ? null : parseFloat(raw)) : raw;
    }
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x === null || y === null) { return (x === null) - (y === null); }
      var order = numeric ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
"""


def _axis_values(rows: list[dict], key: Optional[str]) -> list[str]:
    """A key's values in the grid's order: by number when all are numbers, else as the sweep ran them."""
    if key is None:
        return [""]
    values = list(dict.fromkeys(str(r.get(key, "")) for r in rows))
    if all(number(v) is not None for v in values):
        values.sort(key=lambda v: cast(float, number(v)))  # all numbers: none is None
    return values


@dataclass
class Thumbnail:
    """A grid cell's picture: ``uri`` a data URI of a JPEG (None: nothing to show), ``file`` the image file it
    shows (relative to the run directory: what a click opens), ``unreadable`` what could not be shown of the
    point's files (``file: problem``, one each)."""

    uri: Optional[str] = None
    unreadable: list[str] = field(default_factory=list)
    file: Optional[str] = None


def thumbnail(job_dir: Path, image: int) -> Thumbnail:
    """The point's image ``image`` (its index in the run), or its first image, or its grid, whichever is
    the first that can be shown; a file that cannot (not an image, damaged, a decompression bomb, text
    chunks past Pillow's limits) is named in ``unreadable`` and the next one tried."""
    try:
        records = rundir.image_records(job_dir)
    except rundir.DamagedRecord:  # absent or damaged: the grid, if there is one
        records = []
    wanted = [r.file for r in records if r.index == image]
    out = Thumbnail()
    for name in dict.fromkeys([*wanted, *[r.file for r in records[:1]], rundir.GRID]):
        path = job_dir / str(name)
        if not name or not path.is_file() or not path.resolve().is_relative_to(job_dir.resolve()):
            continue  # a record's file outside its run directory is not shown
        try:
            out.uri, out.file = jpeg_data_uri(path), str(name)
            return out
        except BadImage as bad:
            out.unreadable.append(f"{name}: {bad.problem}")
    return out


def jpeg_data_uri(path: Path) -> str:
    """A data URI of a JPEG thumbnail of the image file ``path`` (:class:`BadImage` where it cannot be read:
    input_images.decoded's bounds)."""
    picture = decoded(image_file_bytes(path))
    try:
        picture = picture.convert("RGB")
        picture.thumbnail((THUMBNAIL, THUMBNAIL))
        buffer = io.BytesIO()
        picture.save(buffer, "JPEG", quality=85)
    except Exception as exc:  # a mode or palette Pillow decodes but cannot convert: a cell it cannot show
        raise BadImage(f"cannot be shown ({console.one_line(exc, 120)})", "an RGB or grayscale image") from None
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _link(target: Path, page_dir: Path) -> str:
    return html.escape(Path(os.path.relpath(target, page_dir)).as_posix(), quote=True)


def _values_label(row: dict, keys) -> str:
    return " ".join(f"{k}={row.get(k, '')}" for k in keys)


def _grid(rows: list[dict], axes: Axes, page_dir: Path, image: int, unreadable: list[str]) -> str:
    """The X/Y/Z grids; what could not be shown of the points' files is added to ``unreadable``."""
    out = []
    pages = list(dict.fromkeys(_values_label(r, axes.z) for r in rows))
    xs, ys = _axis_values(rows, axes.x), _axis_values(rows, axes.y)
    for page in pages:
        in_page = [r for r in rows if _values_label(r, axes.z) == page]
        if page:
            out.append(f'<h3 class="page">{html.escape(page)}</h3>')
        corner = f"{html.escape(axes.y or '')} \\ {html.escape(axes.x or '')}" if axes.x else ""
        out.append(f'<table class="grid" data-page="{html.escape(page, quote=True)}"><thead><tr>'
                   f'<th class="corner">{corner}</th>')
        out.extend(f'<th class="x-label">{html.escape(f"{axes.x}={x}" if axes.x else "")}</th>' for x in xs)
        out.append("</tr></thead><tbody>")
        for y in ys:
            out.append(f'<tr><th class="y-label">{html.escape(f"{axes.y}={y}" if axes.y else "")}</th>')
            for x in xs:
                point = next((r for r in in_page if (axes.x is None or str(r.get(axes.x, "")) == x)
                              and (axes.y is None or str(r.get(axes.y, "")) == y)), None)
                out.append(_cell(point, page_dir, image, unreadable))
            out.append("</tr>")
        out.append("</tbody></table>")
    return "\n".join(out)


def is_reference(row: dict, reference_point: Optional[dict]) -> bool:
    """Whether ``row`` is a point of the reference point (its values of the point's keys; a sampler as
    record/sweep.py writes it): its PSNR/SSIM are blank, being what the others are compared with."""
    if not isinstance(reference_point, dict) or not reference_point:
        return False
    return all(str(row.get(k, "")) == axis_value(str(k), str(v)) for k, v in reference_point.items())


def _cell(row: Optional[dict], page_dir: Path, image: int, unreadable: list[str]) -> str:
    if row is None:
        return '<td class="cell missing empty">no point</td>'
    job_dir = Path(row["dir"])
    thumb = thumbnail(job_dir, image) if row["status"] == "FINISHED" else Thumbnail()
    unreadable.extend(f"job {row['job']}: {problem}" for problem in thumb.unreadable)
    picture = thumb.uri
    caption = [f"#{row['job']}"]
    seconds = row.get("seconds_per_image")
    if seconds is not None:
        caption.append(f"{seconds:.3g} s/img" + (" (first call)" if first_call_only(row) else ""))
    for metric in (m for m in METRICS.values() if not m.needs_reference):  # a reference point's own say "reference"
        value = number(row.get(metric.run_field))
        if value is not None:
            caption.append(f"{metric.short} {value:.3g}")
    if row.get("reference"):
        caption.append("reference")
    if picture is None:
        why = row["status"] if row["status"] != "FINISHED" else "image unreadable" if thumb.unreadable else "no image"
        title = "; ".join(thumb.unreadable) or row.get("error") or ""
        return (f'<td class="cell missing" data-job="{row["job"]}" title="{html.escape(title, quote=True)}">'
                f'{html.escape(why)}<div class="caption">{html.escape(" · ".join(caption))}</div></td>')
    full = _link(job_dir / str(thumb.file), page_dir)
    grid = (f' · <a class="grid-link" href="{_link(job_dir / rundir.GRID, page_dir)}">grid</a>'
            if (job_dir / rundir.GRID).is_file() and thumb.file != rundir.GRID else "")
    return (f'<td class="cell" data-job="{row["job"]}"><a class="full-image" href="{full}" '
            f'title="{html.escape(str(thumb.file), quote=True)} at full size">'
            f'<img src="{picture}" alt="{html.escape(row["label"], quote=True)}"></a>'
            f'<div class="caption">{html.escape(" · ".join(caption))}{grid}</div></td>')


def _table(rows: list[dict], keys: list[str], page_dir: Path, mlflow_ui: Optional[str], front: set[int]) -> str:
    header = ['<th data-type="number">job</th>', *(f'<th class="text">{html.escape(k)}</th>' for k in keys),
              '<th class="text">status</th>',
              *(f'<th data-type="number">{html.escape(label)}</th>' for _, label, _ in NUMBERS),
              '<th class="text">run directory</th>', '<th class="text">MLflow run</th>']
    out = ['<table class="points" id="points"><thead><tr>', *header, "</tr></thead><tbody>"]
    for row in rows:
        classes = [c for c, on in (("failed", row["status"] != "FINISHED"), ("pareto", row["job"] in front),
                                   ("reference", row.get("reference"))) if on]
        out.append(f'<tr class="{" ".join(classes)}" data-job="{row["job"]}"><td data-value="{row["job"]}">'
                   f'{row["job"]}</td>')
        out.extend(f'<td class="text">{html.escape(str(row.get(k, "")))}</td>' for k in keys)
        status = html.escape(row["status"]) + (f" ({html.escape(row['error'][:200])})" if row.get("error") else "")
        out.append(f'<td class="text">{status}</td>')
        for key, _, shown in NUMBERS:
            value = number(row.get(key))
            if value is None and row.get("reference") and key in REFERENCE_METRICS:
                out.append('<td class="reference" data-value="">reference</td>')  # sorts with the blanks
            elif value is None:
                out.append('<td data-value=""></td>')
            elif math.isinf(value):
                out.append(f'<td data-value="{"Infinity" if value > 0 else "-Infinity"}">'
                           f'{"inf (identical)" if value > 0 else "-inf"}</td>')
            elif key == "seconds_per_image" and first_call_only(row):  # not a steady state's: said, off the front
                out.append(f'<td data-value="{value!r}" class="first-call" title="timed by its first call alone '
                           f'(timing.repeats or max_extra_share left no steady-state call)">{shown.format(value)} '
                           '(first call)</td>')
            else:
                out.append(f'<td data-value="{value!r}">{shown.format(value)}</td>')
        job_dir = Path(row["dir"])
        out.append(f'<td class="text"><a href="{_link(job_dir, page_dir)}/">{html.escape(job_dir.name)}</a></td>')
        run_id = row.get("run_id") or ""
        if run_id and mlflow_ui and row.get("experiment_id"):  # the classic run page, not MLflow's GenAI view
            link = html.escape(ui_link(mlflow_ui, row["experiment_id"], run_id), quote=True)
            out.append(f'<td class="text"><a href="{link}">{html.escape(run_id[:12])}</a></td>')
        else:
            out.append(f'<td class="text">{html.escape(run_id[:12])}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _fmt(value: Any, shown: str = "{:.4g}") -> str:
    return "" if value is None else shown.format(value)


def _settings_table(judged: dict, metric: str, label: str) -> str:
    """One metric of every setting: mean, interval and n; against the baseline, the paired difference, its
    interval, the win rate and the pairs."""
    header = ["setting", "values", "points", "n", "mean", "95% interval", "vs baseline: mean difference",
              "95% interval", "win rate", "pairs"]
    out = [f'<table class="settings" data-metric="{html.escape(metric, quote=True)}"><caption>'
           f"{html.escape(label)}</caption><thead><tr>",
           *(f'<th class="{"text" if i < 2 else ""}">{html.escape(h)}</th>' for i, h in enumerate(header)),
           "</tr></thead><tbody>"]
    for index, setting in enumerate(judged.get("settings", [])):
        estimate = setting["metrics"].get(metric) or {}
        versus = (setting.get("versus_baseline") or {}).get(metric)
        cells = [f"S{index + 1}", html.escape(setting["label"]), ", ".join(f"#{j}" for j in setting["jobs"]),
                 str(estimate.get("n", 0)), _fmt(estimate.get("mean")),
                 f"[{_fmt(estimate.get('low'))}, {_fmt(estimate.get('high'))}]" if estimate.get("n") else ""]
        row = [f'<td class="text">{cells[0]}</td>', f'<td class="text">{cells[1]}</td>',
               f'<td class="text">{cells[2]}</td>', *(f"<td>{c}</td>" for c in cells[3:])]
        if setting.get("baseline"):
            row.append('<td class="reference" colspan="4">baseline</td>')
        elif versus and versus.get("n"):
            zero = versus.get("holds_zero")
            row += [f'<td class="{"holds-zero" if zero else ""}">{_fmt(versus["mean"], "{:+.4g}")}</td>',
                    f'<td class="{"holds-zero" if zero else ""}">[{_fmt(versus["low"], "{:+.4g}")}, '
                    f'{_fmt(versus["high"], "{:+.4g}")}]' + (" holds 0: no difference told apart" if zero else "")
                    + "</td>",
                    f"<td>{_fmt(versus.get('win_rate'), '{:.2f}')}</td>", f"<td>{versus['n']}</td>"]
        elif setting.get("pairs"):
            row.append(f'<td class="reference" colspan="4">not compared: {setting["pairs"]} pair(s), but not both '
                       "images of a pair have this metric (PSNR/SSIM: the reference point's own images have none)</td>")
        else:
            row.append('<td class="reference" colspan="4">no pairs (no image of the same seed, index and prompt '
                       "in the baseline)</td>")
        out.append(f'<tr class="{"baseline" if setting.get("baseline") else ""}">' + "".join(row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _cmmd_table(judged: dict) -> str:
    """metrics.cmmd's values: each setting's CMMD against the baseline's images and the reference folder's."""
    found = judged.get("cmmd") or {}
    if not found:
        error = judged.get("cmmd_error")
        return f'<p class="meta">No CMMD: {html.escape(str(error))}</p>' if error else ""
    reference = found.get("reference")
    head = ["setting", "values", "images", "CMMD vs baseline",
            *([f"CMMD vs {reference} ({found.get('reference_images')} images)"] if reference else [])]
    out = [f'<table class="settings" data-metric="cmmd"><caption>CMMD (CLIP {html.escape(str(found.get("model")))}, '
           f'{found.get("image_size")} px; 0: the same distribution)</caption><thead><tr>',
           *(f'<th class="{"text" if i < 2 else ""}">{html.escape(h)}</th>' for i, h in enumerate(head)),
           "</tr></thead><tbody>"]
    for index, setting in enumerate(judged.get("settings", [])):
        entry = setting.get("cmmd") or {}
        cells = [f'<td class="text">S{index + 1}</td>', f'<td class="text">{html.escape(setting["label"])}</td>',
                 f"<td>{entry.get('images', 0)}</td>",
                 '<td class="reference">baseline</td>' if setting.get("baseline") else
                 f"<td>{_fmt(entry.get('versus_baseline'))}</td>"]
        if reference:
            cells.append(f"<td>{_fmt(entry.get('versus_reference'))}</td>")
        out.append(f'<tr class="{"baseline" if setting.get("baseline") else ""}">' + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _settings_section(judged: Optional[dict], rows: list[dict]) -> list[str]:
    """The page's settings section (module docstring); what it says when there is nothing to judge."""
    from sdjax_runner.metrics.report import SETTING_METRICS

    head = '<section id="settings-section"><h2>Settings compared</h2>'
    if not judged or not judged.get("settings"):
        return [head, '<p class="meta">No finished point to judge (comparison.json was not written).</p>',
                "</section>"]
    settings = judged["settings"]
    baseline = judged.get("baseline") or {}
    metrics = [(m, label) for m, label in SETTING_METRICS.items() if any(s["metrics"].get(m) for s in settings)]
    by_job = {r["job"]: r for r in rows}
    seconds, counted = [], []  # each setting's: the median of its points' steady-state seconds, executed GFLOPs
    for setting in settings:
        timed = sorted(x for j in setting["jobs"] if j in by_job and (x := front_seconds(by_job[j])) is not None)
        seconds.append(timed[len(timed) // 2] if timed else None)
        flops = sorted(x for j in setting["jobs"] if j in by_job and (x := gflops(by_job[j])) is not None)
        counted.append(flops[len(flops) // 2] if flops else None)
    meta = [f"{len(settings)} setting(s); seeds and prompts are replicates of a setting. Baseline: "
            f"<code>{html.escape(str(baseline.get('label')))}</code> ({html.escape(str(baseline.get('chosen_by')))})",
            html.escape(str(judged.get("method", "")))]
    if not metrics:
        return [head, *(f'<p class="meta">{m}</p>' for m in meta),
                '<p class="meta">No point has a per-image metric (metrics.clip_score, or a reference point).</p>',
                _cmmd_table(judged), "</section>"]
    plots = settings_plots(judged, seconds, counted)
    return [head, *(f'<p class="meta">{m}</p>' for m in meta),
            *(_settings_table(judged, metric, label) for metric, label in metrics), _cmmd_table(judged),
            *(f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>" for caption, svg in plots),
            "</section>"]


def mlflow_ui_of(rows: list[dict]) -> Optional[str]:
    """Where the points' MLflow runs are shown: the tracking server a point logged to, else the address
    ``mlflow ui`` serves the embedded store at; None when no point has a run."""
    for row in rows:
        if not row.get("run_id"):
            continue
        params = rundir.read_json_or_empty(Path(row["dir"]) / "tracking.json").get("params")
        uri = str(params.get("tracking.uri", "")) if isinstance(params, dict) else ""
        return uri if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return None


def write_page(sweep_dir: Path, rows: list[dict], keys: list[str], axes: Axes, image: int = 0,
               reference_point: Optional[dict] = None, overrides: Optional[list[str]] = None,
               mlflow_ui: Optional[str] = None, judged: Optional[dict] = None) -> Path:
    """Write ``report.html`` for the sweep's summary rows (record/sweep.py: collect_jobs) into
    the sweep directory (its links relative to it); returns its path."""
    rows = [dict(r, seconds_per_image=seconds_per_image(r), reference=is_reference(r, reference_point)) for r in rows]
    finished = [r for r in rows if r["status"] == "FINISHED"]
    front: set[Any] = set()  # jobs on a front; none where seeds or prompts are swept: jobs are not settings then
    for metric in (m.run_field for m in METRICS.values()) if not replicated(keys) else ():
        points = [(front_seconds(r), number(r.get(metric))) for r in finished]  # steady-state seconds alone
        front.update(finished[i]["job"] for i in pareto_front(points))
    plots = svg_plots(finished, keys)
    title = f"Sweep report: {sweep_dir.name}"
    reference = " ".join(f"{k}={v}" for k, v in (reference_point if isinstance(reference_point, dict) else {}).items())
    meta = [f"<code>{html.escape(str(sweep_dir))}</code>",
            f"{len(rows)} point(s): {len(finished)} finished, {len(rows) - len(finished)} not",
            "swept: " + (", ".join(f"<code>{html.escape(k)}</code>" for k in keys) or "nothing")]
    if overrides:
        meta.append("overrides: <code>" + html.escape(" ".join(overrides)) + "</code>")
    if reference:
        meta.append(f"PSNR/SSIM against the reference point <code>{html.escape(reference)}</code>")
    axes_line = (f"x: <code>{html.escape(axes.x or '-')}</code>, y: <code>{html.escape(axes.y or '-')}</code>"
                 + (", pages (z): " + ", ".join(f"<code>{html.escape(k)}</code>" for k in axes.z) if axes.z else "")
                 + " (set with <code>report.x=KEY report.y=KEY</code>)")
    unreadable: list[str] = []
    body = [
        f"<h1>{html.escape(title)}</h1>", *(f'<p class="meta">{m}</p>' for m in meta),
        '<nav><a href="#grid-section">Grid</a><a href="#points-section">Points</a>'
        '<a href="#settings-section">Settings compared</a><a href="#plots-section">Quality and cost</a></nav>',
        '<section id="grid-section"><h2>Grid</h2>', f'<p class="meta">{axes_line}</p>',
        _grid(rows, axes, sweep_dir, image, unreadable), "</section>",
        '<section id="points-section"><h2>Points</h2><p class="meta">Click a column to sort by it; bold: on a '
        "Pareto front (no point is both faster and better).</p>",
        _table(rows, keys, sweep_dir, mlflow_ui, front), "</section>",
        *_settings_section(judged, rows),
        '<section id="plots-section"><h2>Quality and cost</h2>',
        *(f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>" for caption, svg in plots),
        "" if plots else '<p class="meta">No point has a quality metric.</p>', "</section>",
    ]
    text = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n"
            + f'<script type="application/json" id="points-data">{_json(rows)}</script>\n</body></html>\n')
    path = sweep_dir / PAGE
    write_text(path, text.encode("utf-8", "backslashreplace").decode("utf-8"))  # a lone surrogate in a record
    if unreadable:
        log.warning("report: %d image file(s) could not be shown, their cells are grey or show the point's grid: %s",
                    len(unreadable), console.shown("; ".join(unreadable[:5]) + ("; ..." if len(unreadable) > 5 else "")))
    return path


def _json(rows: list[dict]) -> str:
    """The rows as strict JSON for scripts that read the page (no NaN/Infinity), safe inside its script
    element: ``<``, ``>`` and ``&`` written as JSON escapes (``\\u003c``...), so no text in it -- ``</script>``,
    ``<!--<script>`` -- can end the element or change how the browser reads the rest of the page."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return value

    text = json.dumps([{k: clean(v) for k, v in r.items()} for r in rows])
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
