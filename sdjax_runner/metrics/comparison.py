"""Judged comparisons: each per-image metric summarised with its uncertainty, and settings compared with a
baseline on the same replicates.

A sweep's points differ in settings (a sampler, a guidance scale, a dtype) and in replicates: the seed and, with a
prompt set, the prompt (:data:`REPLICATE_KEYS`). Every image of a setting's points is one observation of it. For
each per-image metric (:data:`PER_IMAGE_METRICS`, higher is better) a setting gets its mean with a 95% interval
(:func:`estimate`: the percentile bootstrap of the mean over its images, 2,000 resamples, seed 0) and n; and each
setting but the baseline its paired comparison with the baseline (:func:`paired`): the images of the same
replicate (:func:`replicate`: seed, image index, prompt -- the same starting noise and text) paired, the mean of
the differences with its bootstrap interval, n and the win rate (the share of pairs where the setting is higher,
a tie counting half). A difference whose interval holds 0 is not told apart from none (``holds_zero``).

The baseline is ``metrics.reference_point``'s setting where a sweep has one, else its first setting.
``python -m sdjax_runner evaluate A B`` pairs two runs' images by metrics/fidelity.py's slot instead (the same
image of two runs of one setting: size and negative prompt too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.metrics.registry import per_image
from sdjax_runner.records import ImageRecord, required

# The per-image metrics an image record may hold (metrics/registry.py; higher is better for each).
PER_IMAGE_METRICS = per_image()
# Swept keys whose values are replicates of a setting, not settings: the seed, and a prompt set's prompts.
REPLICATE_KEYS = ("seed", "prompts", "prompts.texts", "prompts.file")
RESAMPLES = 2000
BOOTSTRAP_SEED = 0
LEVEL = 0.95
METHOD = (f"{LEVEL:.0%} interval: percentile bootstrap of the mean, {RESAMPLES} resamples (NumPy default_rng, "
          f"seed {BOOTSTRAP_SEED}); over a setting's images for its mean, over the paired differences for a "
          f"comparison; pairs: the images of the same seed, image index and prompt; win rate: the share of pairs "
          f"where the setting is higher than the baseline, ties half; values that are not finite (PSNR inf: an "
          f"image identical to its reference) are left out and counted")


def bootstrap_interval(values: np.ndarray, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = LEVEL) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values``: ``resamples`` resamples with replacement
    (NumPy's default_rng(seed)), the (1 - level)/2 and (1 + level)/2 quantiles of their means."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    means = values[picks].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def number(value: Any) -> Optional[float]:
    """A metric's value as a float, or None where it is none (absent, a boolean, a text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass
class Estimate:
    """One metric of one setting: the mean of its finite values and its interval."""

    n: int
    mean: float
    low: float
    high: float
    left_out: int = 0  # values that are not finite

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "mean": _finite(self.mean), "low": _finite(self.low), "high": _finite(self.high),
                "left_out": self.left_out}


def estimate(values: Iterable[float]) -> Estimate:
    """Mean, bootstrap interval and n of the finite ``values`` (NaN where none is)."""
    given = list(values)
    finite = np.array([v for v in given if math.isfinite(v)], dtype=np.float64)
    if not len(finite):
        return Estimate(0, math.nan, math.nan, math.nan, len(given))
    return Estimate(len(finite), float(finite.mean()), *bootstrap_interval(finite), left_out=len(given) - len(finite))


@dataclass
class Paired:
    """One metric's paired comparison of B with A (a setting with the baseline: B - A)."""

    metric: str
    n: int  # pairs where both values are finite numbers
    mean: float  # mean of B - A
    low: float  # the interval's ends
    high: float
    higher: int  # pairs where B > A
    ties: int
    left_out: int  # pairs with a value that is not finite (PSNR inf: identical images)

    @property
    def win_rate(self) -> float:
        return (self.higher + 0.5 * self.ties) / self.n if self.n else math.nan

    @property
    def holds_zero(self) -> bool:
        """Whether the interval holds 0: no difference told apart from none."""
        return bool(self.n) and self.low <= 0.0 <= self.high

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "mean": _finite(self.mean), "low": _finite(self.low), "high": _finite(self.high),
                "win_rate": _finite(self.win_rate), "higher": self.higher, "ties": self.ties,
                "lower": self.n - self.higher - self.ties, "holds_zero": self.holds_zero, "left_out": self.left_out}


def paired(metric: str, values: Sequence[tuple[float, float]]) -> Paired:
    """The comparison of the (A, B) value pairs: their differences B - A where both are finite."""
    finite = np.array([(a, b) for a, b in values if math.isfinite(a) and math.isfinite(b)], dtype=np.float64)
    left_out = len(values) - len(finite)
    if not len(finite):
        return Paired(metric, 0, math.nan, math.nan, math.nan, 0, 0, left_out)
    differences = finite[:, 1] - finite[:, 0]
    low, high = bootstrap_interval(differences)
    return Paired(metric, len(differences), float(differences.mean()), low, high, int(np.sum(differences > 0)),
                  int(np.sum(differences == 0)), left_out)


def matched_pairs(a: list[ImageRecord], b: list[ImageRecord], key: Callable[[ImageRecord], Optional[Hashable]]
                  ) -> list[tuple[ImageRecord, ImageRecord]]:
    """(A's record, B's record) for each of B's images whose ``key`` A has, in B's order (a key of None: none)."""
    by_key = {k: r for r in a if (k := key(r)) is not None}
    return [(by_key[k], r) for r in b if (k := key(r)) is not None and k in by_key]


def paired_metrics(pairs: list[tuple[ImageRecord, ImageRecord]]) -> list[Paired]:
    """Each per-image metric both records of some pair have, compared pair by pair."""
    out = []
    for metric in PER_IMAGE_METRICS:
        values = [(x, y) for ra, rb in pairs
                  if (x := number(getattr(ra, metric))) is not None and (y := number(getattr(rb, metric))) is not None]
        if values:
            out.append(paired(metric, values))
    return out


def replicate(record: ImageRecord) -> Optional[tuple]:
    """What makes two settings' images the same replicate: the seed, the image's index in its run and its prompt
    (the same starting noise and text); None where the record lacks one."""
    try:
        return required(record.index, "index"), str(required(record.seed, "seed")), required(record.prompt, "prompt")
    except KeyError:
        return None


@dataclass
class Setting:
    """The points of a sweep that share their values of every swept key but the replicate keys."""

    values: dict[str, str]
    jobs: list[int] = field(default_factory=list)
    records: list[ImageRecord] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # its images on disk, where the points' folders were given

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items()) or "all points"


def settings_of(points: Iterable[tuple], keys: Sequence[str]) -> list[Setting]:
    """The settings of a sweep's points -- (job, its values of the swept ``keys``, its image records[, its run
    directory]) -- in the order of their first point."""
    setting_keys = [k for k in keys if k not in REPLICATE_KEYS]
    settings: dict[tuple, Setting] = {}
    for job, values, records, *folder in points:
        wanted = {k: str(values.get(k, "")) for k in setting_keys}
        setting = settings.setdefault(tuple(wanted.values()), Setting(wanted))
        setting.jobs.append(job)
        setting.records.extend(records)
        if folder:
            setting.files.extend(Path(folder[0]) / str(r.file) for r in records if r.file)
    return list(settings.values())


def baseline_of(settings: list[Setting], reference_point: Optional[dict[str, str]]) -> tuple[int, str]:
    """(index of the baseline setting, how it was chosen): the one with the reference point's values of the keys
    it names (its first, where several are), else the first."""
    from sdjax_runner.config.report_axes import axis_value

    named = {k: axis_value(k, str(v)) for k, v in (reference_point or {}).items() if k not in REPLICATE_KEYS}
    if named:
        for index, setting in enumerate(settings):
            if all(setting.values.get(k) == v for k, v in named.items() if k in setting.values):
                return index, "metrics.reference_point"
    return 0, "the first setting"


def compare(settings: list[Setting], baseline: int, chosen_by: str) -> dict[str, Any]:
    """comparison.json's content: each setting's estimates and, but for the baseline's, its paired comparisons."""
    base = settings[baseline] if settings else None
    out = []
    for index, setting in enumerate(settings):
        metrics = {}
        for metric in PER_IMAGE_METRICS:
            values = [v for r in setting.records if (v := number(getattr(r, metric))) is not None]
            if values:
                metrics[metric] = estimate(values).to_json()
        entry: dict[str, Any] = {"setting": setting.values, "label": setting.label, "jobs": setting.jobs,
                                 "images": len(setting.records), "metrics": metrics, "baseline": index == baseline}
        if base is not None and index != baseline:
            pairs = matched_pairs(base.records, setting.records, replicate)
            entry["pairs"] = len(pairs)
            entry["versus_baseline"] = {row.metric: row.to_json() for row in paired_metrics(pairs)}
        out.append(entry)
    return {"method": METHOD, "replicate_keys": list(REPLICATE_KEYS), "level": LEVEL,
            "baseline": {"label": base.label if base else None, "setting": base.values if base else None,
                         "chosen_by": chosen_by},
            "settings": out}


def _finite(value: float) -> Optional[float]:
    """A number as strict JSON holds it: NaN (nothing to say) as null."""
    return None if math.isnan(value) else value


def table_rows(judged: dict[str, Any]) -> list[dict[str, Any]]:
    """comparison.json as one row per setting and metric (an MLflow table's rows): the setting, its estimate and,
    but for the baseline's, its paired comparison; blanks where a value is none."""
    out = []
    for index, setting in enumerate(judged.get("settings", [])):
        for metric, found in setting.get("metrics", {}).items():
            versus = (setting.get("versus_baseline") or {}).get(metric) or {}
            out.append({"setting": f"S{index + 1}", "label": setting["label"], "baseline": setting["baseline"],
                        "metric": metric, "n": found["n"], "mean": found["mean"], "low": found["low"],
                        "high": found["high"], "vs_baseline_mean": versus.get("mean"),
                        "vs_baseline_low": versus.get("low"), "vs_baseline_high": versus.get("high"),
                        "win_rate": versus.get("win_rate"), "holds_zero": versus.get("holds_zero"),
                        "pairs": versus.get("n")})
    return out
