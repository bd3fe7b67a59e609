"""Runs on disk, found and read back without MLflow: every run directory under an output root (single
runs and sweep jobs), a one-line summary of each, and the differences between two runs."""

from __future__ import annotations

import datetime
import fnmatch
import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf

from sdjax_runner.config.naming import SHORT_KEYS
from sdjax_runner.config.overrides import recorded_resolver_calls
from sdjax_runner.console import one_line
from sdjax_runner.files import read_yaml
from sdjax_runner.metrics.registry import METRICS
from sdjax_runner.record import rundir

# What a summary shows of a run's config and of its numbers.
KEY_PARAMS = ("model.name", "dtype.name", "sampler", "scheduler.name", "sampling.num_inference_steps",
              "sampling.guidance_scale", "seed", "parallelism.mode")
HEADLINE = ("images_per_s", "generate_s", "compile_s", "wall_s", *(m.run_field for m in METRICS.values()))


def find_runs(root: Path) -> Iterator[Path]:
    """Every run directory under ``root`` (a directory with status.json), or ``root`` itself."""
    if (root / rundir.STATUS).is_file():
        yield root
        return
    for status in root.rglob(rundir.STATUS):
        yield status.parent


# How reading a recorded config fails: absent or unreadable, damaged YAML, or not a mapping.
CONFIG_ERRORS = (OSError, ValueError, yaml.YAMLError)


def read_config(run_dir: Path) -> Any:
    """The run's recorded config as plain data; one of CONFIG_ERRORS if it is absent, unreadable,
    damaged or not a mapping."""
    data = read_yaml(run_dir / rundir.CONFIG)  # bounded: size, depth, no aliases (files.py)
    if not isinstance(data, dict):
        raise ValueError(f"a {type(data).__name__}, not a mapping of config keys")
    return data


def flat_config(run_dir: Path, needed: Optional[Iterable[str]] = None) -> dict[str, str]:
    """The run's recorded config, flattened (see _flatten); empty if it cannot be read."""
    try:
        return _flatten(read_config(run_dir), needed)
    except CONFIG_ERRORS:  # absent, unreadable or damaged: nothing to show
        return {}


def _flatten(data: dict, needed: Optional[Iterable[str]] = None) -> dict[str, str]:
    """A config flattened (``sampling.num_inference_steps: "4"``, lists as JSON), interpolations
    resolved where this environment can (else shown as written). ``needed``: only these keys' values
    must be resolved (resolving builds the whole OmegaConf tree, ~8 ms a run, which a listing of
    thousands of runs cannot afford for keys it does not show)."""
    flat = dict(_walk(data))
    pending = [value for key, value in flat.items() if needed is None or key in needed]
    if not any("${" in value for value in pending) or any(recorded_resolver_calls(data)):
        return flat  # nothing to resolve, or a lookup the packaged config does not make: shown as written
    try:
        return dict(_walk(OmegaConf.to_container(OmegaConf.create(data), resolve=True, enum_to_str=True)))
    except Exception:  # an interpolation this environment cannot resolve: shown as written
        return flat


def _walk(node: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        yield prefix, json.dumps(node, ensure_ascii=False, default=str)
    else:
        yield prefix, "null" if node is None else str(node)


def summary(run_dir: Path, config: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Name, status, start, key params and headline numbers of one run (``config``: its flat config,
    if already read)."""
    try:
        status, damaged = rundir.read_record(run_dir / rundir.STATUS), ""
    except rundir.DamagedRecord as exc:  # listed, blank, and named once by the listing
        status, damaged = {}, str(exc)
    numbers = _recorded_numbers(run_dir)
    config = flat_config(run_dir) if config is None else config
    return {
        "dir": str(run_dir),
        "name": status.get("run_name") or config.get("run_name", run_dir.name),
        "status": shown_status(status),
        "started": status.get("started_at") or "",
        "run_id": status.get("run_id") or "",
        # the sampler as the listing shows it: what ran, as A1111 spells it
        **{key: sampler_label(config) if key == "sampler" else config.get(key, "") for key in KEY_PARAMS},
        **{key: numbers.get(key, "") for key in HEADLINE},
        "damaged": damaged,
    }


REFUSED = "REFUSED"  # a run bad input stopped before it made an image: status.json's FAILED with "refused"


def shown_status(status: dict[str, Any]) -> str:
    """status.json's status, or :data:`REFUSED` for a run refused for bad input (the tracker has it FAILED)."""
    state = status.get("status", "UNKNOWN")
    return REFUSED if state == "FAILED" and status.get("refused") is True else state


def sampler_label(config: dict[str, str]) -> str:
    """What the run sampled with, as A1111 spells it (``DPM++ 2M Karras``; a diffusers scheduler by its name,
    ``pndm``), from its recorded ``sampler`` and ``scheduler.name``, for its model's family (FLUX.1's Euler on its
    own schedule: ``Euler``); blank where the config has neither."""
    from types import SimpleNamespace

    from sdjax_runner.config.families import planned
    from sdjax_runner.config.samplers import label_of
    from sdjax_runner.errors import UserError

    sampler, scheduler = config.get("sampler", "null"), config.get("scheduler.name", "")
    if sampler == "null" and not scheduler:
        return ""

    def value(key: str) -> Optional[str]:
        return None if config.get(key, "null") == "null" else config[key]

    model = SimpleNamespace(family=value("model.family"), builtin=value("model.builtin"),
                            pretrained_model_name_or_path=value("model.pretrained_model_name_or_path"))
    try:
        family = planned(model)
    except UserError:  # a recorded family this version does not know: the SD family's reading
        return label_of(None if sampler == "null" else sampler, scheduler)
    return label_of(None if sampler == "null" else sampler, scheduler, family.sampling)


def _recorded_numbers(run_dir: Path) -> dict[str, Any]:
    return {**rundir.read_timings(run_dir).to_json(), **rundir.read_quality(run_dir).to_json()}


def numbers(run_dir: Path) -> dict[str, float]:
    """The run's numeric timings and quality metrics."""
    data = _recorded_numbers(run_dir)
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def config_diff(a: Path, b: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(key, value in a, value in b) for every config key whose values differ -- or, if either config
    cannot be read, no rows and why (``A's .hydra/config.yaml cannot be read (...)``), so that a
    damaged record is named rather than shown as every key differing."""
    flats, problems = [], []
    for label, run in (("A", a), ("B", b)):
        try:
            flats.append(_flatten(read_config(run)))
        except CONFIG_ERRORS as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc, 120)
            problems.append(f"{label}'s {rundir.CONFIG} cannot be read ({type(exc).__name__}: {reason})")
    if problems:
        return [], problems
    left, right = flats
    return [(k, left.get(k, "-"), right.get(k, "-")) for k in sorted(set(left) | set(right))
            if left.get(k, "-") != right.get(k, "-")], []


def metric_diff(a: Path, b: Path, keys: Optional[tuple[str, ...]] = None) -> list[tuple[str, float, float, str]]:
    """(metric, a, b, b/a) for the metrics both runs have (``keys``: only these)."""
    left, right = numbers(a), numbers(b)
    rows = []
    for key in sorted(set(left) & set(right)):
        if keys and key not in keys:
            continue
        x, y = left[key], right[key]
        ratio = f"{y / x:.3g}x" if x and math.isfinite(x) and math.isfinite(y) else ""
        rows.append((key, x, y, ratio))
    return rows


ALIASES = SHORT_KEYS  # short names for the keys a listing shows, usable in filters (``model=sd-v1-4``)
# Keys of a run's record besides its config that filters can name.
RECORD_KEYS = ("status", "name", "run_id")


def parse_filters(terms: list[str]) -> dict[str, list[str]]:
    """``KEY=PATTERN`` terms → {key: [patterns]}; the same key given twice means either pattern."""
    filters: dict[str, list[str]] = {}
    for term in terms:
        key, sep, pattern = term.partition("=")
        if not sep or not key:
            raise ValueError(f"{term}: a filter is KEY=VALUE (e.g. model=sd-v1-4, dtype.name=bf16, status=FAILED)")
        filters.setdefault(ALIASES.get(key, key), []).append(pattern)
    return filters


def filterable(config: dict[str, str], summary_: dict[str, Any]) -> dict[str, Any]:
    """What filters match against: the run's flat config, plus its status, name and tracker run id; ``sampler``
    matches the value as given or as the listing shows it (``sampler=DPM++*`` and ``sampler=dpmpp_2m*``)."""
    values: dict[str, Any] = dict(config, **{key: str(summary_[key]) for key in RECORD_KEYS})
    if summary_.get("sampler"):
        values["sampler"] = (config.get("sampler", "null"), summary_["sampler"])
    return values


def matches(values: dict[str, Any], filters: dict[str, list[str]]) -> bool:
    """Every filtered key has a value matching one of its patterns (shell-style: ``*``, ``?``, ``[..]``); a
    key with several values (a tuple) matches when one of them does."""
    def any_matches(value: Any, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(v, p) for v in (value if isinstance(value, tuple) else (value,))
                   for p in patterns)

    return all(key in values and any_matches(values[key], patterns) for key, patterns in filters.items())


def parse_since(text: str, now: Optional[datetime.datetime] = None) -> datetime.datetime:
    """``7d``, ``12h``, ``30m`` ago, or a date/time (``2026-11-15``, ``2026-11-15T09:30``, local time
    unless it has an offset) → an aware datetime."""
    now = now or datetime.datetime.now().astimezone()
    relative = re.fullmatch(r"(\d+)([dhm])", text)
    if relative:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[relative.group(2)]
        return now - datetime.timedelta(**{unit: int(relative.group(1))})
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text}: not a time (allowed: 7d, 12h, 30m, 2026-11-15, 2026-11-15T09:30)") from None
    return moment if moment.tzinfo else moment.astimezone()


def started_at(summary_: dict[str, Any]) -> Optional[datetime.datetime]:
    try:
        return datetime.datetime.fromisoformat(summary_["started"])
    except (TypeError, ValueError):
        return None
