"""The sweep report's plots: speed against each quality metric (the Pareto view, its front marked) and
each metric against each swept value -- one matplotlib figure saved beside the contact sheet
(report.png), and the same plots one by one as SVG for report.html (record/report_page.py).

Rows are the quality metrics the sweep has (CLIP score, PSNR and SSIM to the reference); the first
column plots seconds per image against the metric, one point per job, numbered (the key under the
figure gives each job's swept values); the other columns plot the metric against each swept key's
values, one line per combination of the other swept keys (a sampler x steps sweep: each sampler's
quality against its step count). PSNR of a job identical to the reference is
``inf``: it is drawn at the top of its axis and marked so.
"""

from __future__ import annotations

import math
from typing import IO, Any, Optional, cast

from sdjax_runner.metrics.registry import METRICS

# The run-level value of each quality metric (metrics/registry.py) and its axis label.
QUALITY = {m.run_field: m.plot_label for m in METRICS.values()}


def number(value: Any) -> Optional[float]:
    """``value`` as a float (a summary cell is a string or a number), or None: blank, not a number, NaN."""
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past a float's range
        return None
    return None if math.isnan(out) else out


# Every text in the figures is shown as written: a swept value, a label or a key of the sweep is text from
# users, and ``$x^2$`` in it is neither mathtext (which draws it as math, and fails on ``$\\frac$``) nor LaTeX.
PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False, "axes.formatter.use_mathtext": False}
SVG = {"svg.fonttype": "none", "svg.hashsalt": "sdjax-runner"}  # text as text; stable ids


def drawing(settings: dict):
    """matplotlib (Agg) with ``settings`` for what is drawn inside: a figure is made and saved in it (tick
    labels are made when the figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    return matplotlib.rc_context(settings)


def _values(rows: list[dict], metric: str) -> tuple[list[Optional[float]], Optional[float]]:
    """The metric per row with inf drawn at a cap above the finite values; (values, cap or None)."""
    values = [number(r.get(metric)) for r in rows]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not any(v is not None and math.isinf(v) for v in values):
        return values, None
    cap = (max(finite) + 5.0) if finite else 100.0
    return [cap if v is not None and math.isinf(v) else v for v in values], cap


def series_of(rows: list[dict], values: list[Optional[float]], key: str, keys: list[str]
              ) -> dict[str, list[tuple[str, float]]]:
    """The points (``key``'s value, metric) of each combination of the other swept keys, named
    ``other=value ...``: one line each in the metric-vs-``key`` plot (sampler=... against steps=...:
    which sampler reaches a quality in the fewest steps)."""
    others = [k for k in keys if k != key]
    series: dict[str, list[tuple[str, float]]] = {}
    for r, y in zip(rows, values, strict=True):
        if y is not None:
            series.setdefault(" ".join(f"{k}={r.get(k, '')}" for k in others), []).append((str(r.get(key, "")), y))
    return series


def seconds_per_image(row: dict) -> Optional[float]:
    """Seconds per image of a summary row (1 / images_per_s: the steady state's, or the first call's where the
    row's steady_calls is 0), or None."""
    speed = number(row.get("images_per_s"))
    return 1.0 / speed if speed else None


def first_call_only(row: dict) -> bool:
    """Whether a row's seconds come from its first call alone (steady_calls 0: compile-time effects, a warm-up
    the steady state does not pay): shown, marked, and never on the Pareto front as if measured."""
    return number(row.get("steady_calls")) == 0


def front_seconds(row: dict) -> Optional[float]:
    """A row's seconds per image where they may place it on the Pareto front: measured in the steady state."""
    return None if first_call_only(row) else seconds_per_image(row)


def gflops(row: dict) -> Optional[float]:
    """A row's executed GFLOPs per image (record/sweep.py's gflops_per_image: XLA's count of what its program ran,
    a step cache's skipped calls taken off), or None."""
    return number(row.get("gflops_per_image"))


def untimed_but_counted(rows: list[dict]) -> list[dict]:
    """The rows without steady-state seconds (first call alone) where every row has executed FLOPs: their cost is
    then plotted as the FLOPs too (a second quality-vs-cost plot; seconds from a first call are no cost to compare).
    Empty where every row was timed in the steady state, or where some row's FLOPs are unknown."""
    untimed = [r for r in rows if first_call_only(r)]
    return untimed if untimed and all(gflops(r) is not None for r in rows) else []


def pareto_front(points: list[tuple[Optional[float], Optional[float]]]) -> list[int]:
    """Indices of the (seconds, quality) points no other point beats on both (as fast or faster and at
    least as good, better in one), fastest first: the settings worth choosing between."""
    known = [(x, y, i) for i, (x, y) in enumerate(points) if x is not None and y is not None]
    front, best = [], -math.inf
    for _x, y, i in sorted(known, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append(i)
            best = y
    return front


def _svg(figure) -> str:
    import io

    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # inline: without the XML declaration and doctype


def replicated(keys: list[str]) -> bool:
    """Whether the sweep's swept ``keys`` include replicates (seeds, prompts: metrics/comparison.py): then its jobs
    are not settings, and a Pareto front over them would be one over seeds; the front is drawn over settings
    (settings_plots) instead."""
    from sdjax_runner.metrics.comparison import REPLICATE_KEYS

    return any(key in REPLICATE_KEYS for key in keys)


def _against_seconds(ax, rows: list[dict], seconds: list, values: list, cap: Optional[float], metric: str,
                     fontsize: int, with_front: bool = True, counted: bool = False) -> list[int]:
    """The metric against seconds per image on ``ax``: a numbered point per job, the Pareto front as a red
    staircase with its points ringed (``with_front``), inf drawn at ``cap``; returns the front (row indices,
    fastest first; none without ``with_front``). ``counted``: ``seconds`` are executed GFLOPs per image instead,
    every point placed alike."""
    for r, x, y in zip(rows, seconds, values, strict=True):
        if x is not None and y is not None:
            first = first_call_only(r) and not counted  # hollow and grey: its seconds are its first call's
            ax.scatter(x, y, s=18, facecolors="none" if first else "tab:blue",
                       edgecolors="tab:gray" if first else "tab:blue")
            ax.annotate(f"#{r['job']}" + (" (first call)" if first else ""), (x, y), fontsize=fontsize,
                        xytext=(3, 3), textcoords="offset points")
    front = pareto_front([(None if first_call_only(r) and not counted else x, y)
                          for r, x, y in zip(rows, seconds, values, strict=True)]) if with_front else []
    if front:
        ax.step([seconds[i] for i in front], [values[i] for i in front], where="post", color="tab:red",
                linewidth=1, label="Pareto front")
        ax.scatter([seconds[i] for i in front], [values[i] for i in front], facecolors="none",
                   edgecolors="tab:red", s=70, linewidths=1.2)
        ax.legend(fontsize=7, loc="lower right")
    if cap is not None:
        ax.axhline(cap, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate("inf: identical to the reference", (0.01, 0.97), xycoords="axes fraction", fontsize=7,
                    va="top", color="grey")
    ax.set_xlabel(COUNTED_AXIS if counted else "seconds per image (1 / images_per_s)")
    ax.set_ylabel(QUALITY[metric])
    ax.locator_params(axis="x", nbins=5)
    return front


COUNTED_AXIS = "executed GFLOPs per image (XLA's count of what ran)"


def _labels(series: dict) -> list[str]:
    """The swept key's values that series_of's series hold, in order of appearance."""
    return list(dict.fromkeys(x for points in series.values() for x, _ in points))


def _against_key(ax, series: dict, key: str, metric: str) -> None:
    """The metric against ``key``'s values on ``ax``, a line per series (series_of); values that are not all
    numbers are placed evenly in their order, labelled."""
    labels = _labels(series)
    numeric = all(number(x) is not None for x in labels)
    for name, points in series.items():
        # numeric: every label is a number (none is None)
        order = sorted(points, key=lambda point: cast(float, number(point[0])) if numeric else labels.index(point[0]))
        xs = [number(x) if numeric else labels.index(x) for x, _ in order]
        ax.plot(xs, [y for _, y in order], "o-" if len(order) > 1 else "o", label=name or None, markersize=4)
    if 1 < len(series) <= 12:
        ax.legend(fontsize=6)
    if not numeric:
        ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
    ax.set_xlabel(key)
    ax.set_ylabel(QUALITY[metric])


def svg_plots(rows: list[dict], keys: list[str]) -> list[tuple[str, str]]:
    """(caption, inline SVG) for report.html: per quality metric the sweep has, the metric against seconds
    per image with the Pareto front marked, then against each swept key whose values are all numbers, seed
    aside (one line per combination of the other swept keys). Points are numbered by job."""
    with drawing({**PLAIN_TEXT, **SVG}):
        return _svg_plots(rows, keys)


def _svg_plots(rows: list[dict], keys: list[str]) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    out = []
    seconds = [seconds_per_image(r) for r in rows]
    with_front = not replicated(keys)
    for metric in (m for m in QUALITY if any(number(r.get(m)) is not None for r in rows)):
        values, cap = _values(rows, metric)
        figure, ax = plt.subplots(figsize=(5.2, 3.6))
        front = _against_seconds(ax, rows, seconds, values, cap, metric, fontsize=7, with_front=with_front)
        front_jobs = ", ".join(f"#{rows[i]['job']}" for i in front)
        first = [f"#{r['job']}" for r in rows if first_call_only(r)]
        said = f"Pareto front (red): {front_jobs or 'none'}" if with_front else (
            "a point per job; seeds and prompts are replicates, not settings: the Pareto front over settings is "
            "under Settings compared")
        out.append((f"{QUALITY[metric]} against seconds per image; {said}"
                    + (f"; timed by their first call alone{', off the front' if with_front else ''} (hollow): "
                       f"{', '.join(first)}" if first else ""), _svg(figure)))
        if untimed_but_counted(rows):  # their cost as XLA counts it, every point placed
            figure, ax = plt.subplots(figsize=(5.2, 3.6))
            front = _against_seconds(ax, rows, [gflops(r) for r in rows], values, cap, metric, fontsize=7,
                                     with_front=with_front, counted=True)
            said = (f"Pareto front (red): {', '.join(f'#{rows[i]['job']}' for i in front) or 'none'}" if with_front
                    else "a point per job")
            out.append((f"{QUALITY[metric]} against executed GFLOPs per image (the cost where no steady state was "
                        f"timed: {', '.join(first)}); {said}", _svg(figure)))
        for key in keys:
            series = series_of(rows, values, key, keys)
            labels = _labels(series)
            if key == "seed" or not labels or any(number(x) is None for x in labels):
                continue  # a seed is a number, not a setting: quality against it is noise
            figure, ax = plt.subplots(figsize=(5.2, 3.6))
            _against_key(ax, series, key, metric)
            out.append((f"{QUALITY[metric]} against {key}", _svg(figure)))
    return out


def write_report(file: IO[bytes], rows: list[dict], keys: list[str], reference_point: Optional[dict] = None) -> bool:
    """report.png, for a sweep's summary rows, into ``file``; False (nothing written) when no job has a quality
    metric."""
    metrics = [m for m in QUALITY if any(number(r.get(m)) is not None for r in rows)]
    if not metrics:
        return False
    with drawing(PLAIN_TEXT):
        _draw_report(file, rows, keys, metrics, reference_point)
    return True


def _draw_report(file: IO[bytes], rows: list[dict], keys: list[str], metrics: list[str],
                 reference_point: Optional[dict]):
    import matplotlib.pyplot as plt

    columns = 1 + len(keys)
    key_lines = [f"#{r['job']}  {r['label']}" for r in rows]
    figure, axes = plt.subplots(len(metrics), columns, squeeze=False,
                                figsize=(4.2 * columns, 3.4 * len(metrics) + 0.6 + 0.16 * len(key_lines)))
    speed = [seconds_per_image(r) for r in rows]
    for row, metric in enumerate(metrics):
        values, cap = _values(rows, metric)
        _against_seconds(axes[row][0], rows, speed, values, cap, metric, fontsize=8, with_front=not replicated(keys))
        for column, key in enumerate(keys, start=1):
            _against_key(axes[row][column], series_of(rows, values, key, keys), key, metric)
            if cap is not None:
                axes[row][column].axhline(cap, color="grey", linestyle=":", linewidth=0.8)
    reference = " ".join(f"{k}={v}" for k, v in (reference_point or {}).items())
    figure.suptitle("quality vs speed" + (f"; PSNR/SSIM against the reference point {reference}" if reference else ""))
    figure.text(0.01, 0.005, "\n".join(key_lines), fontsize=8, va="bottom", family="monospace")
    figure.tight_layout(rect=(0, (0.3 + 0.16 * len(key_lines)) / figure.get_figheight(), 1, 0.97))
    figure.savefig(file, dpi=100, format="png")
    plt.close(figure)


# -- settings judged (metrics/comparison.py's comparison.json) ----------------------------------------------------

SETTING_METRICS = {m.name: m.setting_label for m in METRICS.values()}
MAX_NAMED_SETTINGS = 30  # settings named beside their points; with more, the baseline alone (the table names all)


def settings_plots(judged: dict, seconds: list[Optional[float]],
                   counted: Optional[list[Optional[float]]] = None) -> list[tuple[str, str]]:
    """(caption, inline SVG) per per-image metric of comparison.json's settings: each setting's mean with its 95%
    interval as an error bar, against its seconds per image (``seconds``, one per setting: the steady state's,
    None where unmeasured) with the Pareto front over settings marked; against the settings in order where no
    setting's seconds are known. Where some setting has no steady-state seconds and every setting has its
    executed GFLOPs per image (``counted``, the median of its points'), against those instead, said in the caption.
    Settings are numbered S1, S2, ... as in the page's table."""
    untimed = [f"S{i + 1}" for i, x in enumerate(seconds) if x is None]
    by_flops = bool(untimed) and counted is not None and all(x is not None for x in counted)
    with drawing({**PLAIN_TEXT, **SVG}):
        plots = _settings_plots(judged, counted if by_flops and counted is not None else seconds, by_flops)
    if by_flops:
        plots = [(f"{caption}; placed by executed GFLOPs per image, no steady-state seconds for {', '.join(untimed)}",
                  svg) for caption, svg in plots]
    return plots


def _settings_plots(judged: dict, seconds: list[Optional[float]], by_flops: bool = False) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    settings = judged.get("settings", [])
    out = []
    timed = any(s is not None for s in seconds)
    for metric, name in SETTING_METRICS.items():
        estimates = [s["metrics"].get(metric) for s in settings]
        if not any(e and e.get("n") for e in estimates):
            continue
        figure, ax = plt.subplots(figsize=(5.2, 3.6))
        points: list[tuple[Optional[float], Optional[float]]] = []
        drawn: dict[bool, list[tuple[float, float, float, float]]] = {True: [], False: []}  # baseline or not
        for index, (estimate, x) in enumerate(zip(estimates, seconds, strict=True)):
            x = x if timed else float(index)
            if not estimate or not estimate.get("n") or x is None:
                points.append((None, None))
                continue
            mean, low, high = estimate["mean"], estimate["low"], estimate["high"]
            baseline = bool(settings[index].get("baseline"))
            drawn[baseline].append((x, mean, mean - low, high - mean))
            if baseline or len(settings) <= MAX_NAMED_SETTINGS:  # past that the names would cover the points
                ax.annotate(f"S{index + 1}" + (" (baseline)" if baseline else ""), (x, mean), fontsize=7,
                            xytext=(4, 3), textcoords="offset points")
            points.append((x, mean))
        for baseline, bars in drawn.items():  # one call per kind: 200 settings draw as fast as 2
            if bars:
                xs, means, below, above = zip(*bars, strict=True)
                ax.errorbar(xs, means, yerr=[below, above], fmt="s" if baseline else "o", capsize=3, linestyle="none",
                            color="tab:green" if baseline else "tab:blue", markersize=5)
        front = pareto_front(points) if timed else []
        if front:
            ax.step([cast(float, points[i][0]) for i in front], [cast(float, points[i][1]) for i in front],
                    where="post", color="tab:red", linewidth=1, label="Pareto front (settings)")
            ax.legend(fontsize=7, loc="lower right")
        if timed:
            ax.set_xlabel(f"{COUNTED_AXIS}, median of the setting's points" if by_flops
                          else "seconds per image (1 / images_per_s, median of the setting's points)")
        else:
            ax.set_xticks(range(len(settings)), [f"S{i + 1}" for i in range(len(settings))], fontsize=7)
            ax.set_xlabel("setting")
        ax.set_ylabel(f"{name}, mean and 95% interval")
        front_names = ", ".join(f"S{i + 1}" for i in front)
        unplaced = [f"S{i + 1}" for i, (estimate, x) in enumerate(zip(estimates, seconds, strict=True))
                    if estimate and estimate.get("n") and timed and x is None]
        out.append((f"{name} per setting: mean and 95% interval over its images (seeds and prompts are replicates)"
                    + (f"; Pareto front over settings (red): {front_names}" if front else "")
                    + (f"; not placed, no steady-state seconds: {', '.join(unplaced)}" if unplaced else ""),
                    _svg(figure)))
    return out
