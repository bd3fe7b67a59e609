"""One line for whatever stopped a command or a job: bad input the user can fix (a UserError, a config
Hydra or OmegaConf refused, named by its key with what the schema allows there), a full disk, an
interrupt. Anything else -- a bug -- has no line here and keeps its traceback."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Optional

from sdjax_runner import process
from sdjax_runner.config import schema
from sdjax_runner.config.schema import SCALAR_WORDS, RunConfig, field_types, without_null
from sdjax_runner.console import one_line
from sdjax_runner.errors import DISK_ERRORS, Terminated, UserError

# Keys a release moved, and where they went: naming one is its new keys' one line, not an unknown key's.
MOVED = {"sampling.slg_layers": "guider=skip_layer 'guider.layers=[7,8,9]' (docs/guides/samplers.md, \"Guiders\")",
         "sampling.slg_scale": "guider=skip_layer guider.scale=2.8",
         "sampling.slg_start": "guider=skip_layer guider.skip_start=0.01",
         "sampling.slg_stop": "guider=skip_layer guider.skip_stop=0.2"}


def _schema_node(parts: list[str]) -> typing.Any:
    """The schema's type at the dotted path ``parts`` (a dataclass or a field's type), or None."""
    node: typing.Any = RunConfig
    for part in parts:
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)) or part not in field_types(node):
            return None
        node = field_types(node)[part]
    return node


def _schema_keys(full_key: str) -> Optional[list[str]]:
    """The keys the schema allows beside ``full_key`` (e.g. sampling.foo -> sampling's fields)."""
    node = _schema_node(full_key.split(".")[:-1])
    if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
        return None
    return list(field_types(node))


def _schema_class(message: str) -> typing.Any:
    """The schema dataclass an OmegaConf message names (``Key 'foo' not in 'LoraConfig'``), or None."""
    named = re.search(r"not in '(\w+)'", message)
    found = getattr(schema, named.group(1), None) if named else None
    return found if dataclasses.is_dataclass(found) else None



def _schema_kind(full_key: str) -> Optional[str]:
    """What the schema's field ``full_key`` takes, in words (``a number or null``), or None."""
    node, optional = without_null(_schema_node(full_key.split(".")))
    kind = "a list, e.g. [a,b]" if typing.get_origin(node) is list else SCALAR_WORDS.get(node)
    if kind is None:
        return None
    return kind + (" or null" if optional else "")


# Hydra launchers that come with an optional extra of this package, and how to install each.
OPTIONAL_LAUNCHERS = {"joblib": "pip install 'sdjax-runner[joblib]'", "ray": "pip install 'sdjax-runner[ray]'",
                      "submitit_slurm": "pip install 'sdjax-runner[slurm]'",
                      "submitit_local": "pip install 'sdjax-runner[slurm]'",
                      "slurm_workers": "pip install 'sdjax-runner[slurm]'",
                      "local_workers": "pip install 'sdjax-runner[slurm]'"}


def describe(exc: BaseException) -> Optional[str]:
    """One line for a config or input error, or None if ``exc`` is not one (a bug, say)."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        MissingMandatoryValue,
        OmegaConfBaseException,
        ValidationError,
    )

    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror} -- the outputs could not be written (allowed: {DISK_ERRORS[exc.errno]})"
    if isinstance(exc, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", str(exc))
        if found and "/" in found.group(1):
            group, option = found.group(1).rsplit("/", 1)
            allowed = ", ".join(exc.options) if exc.options else "none found"
            install = OPTIONAL_LAUNCHERS.get(option) if group == "hydra/launcher" else None
            if install:
                return f"{group}={option}: the launcher is not installed ({install}; allowed now: {allowed})"
            return f"{group}={option}: no such option (allowed: {allowed}{sampler_hint(group, option)})"
        return one_line(exc, None)
    cause = exc.__cause__ if isinstance(exc, HydraException) else None
    omega = exc if isinstance(exc, OmegaConfBaseException) else cause
    if isinstance(omega, OmegaConfBaseException):
        key = getattr(omega, "full_key", None) or ""
        message = getattr(omega, "msg", None) or str(omega)
        message = one_line(message.split("\n")[0], None)
        if isinstance(omega, MissingMandatoryValue):
            return f"{key}: a value is required (set it on the command line: {key}=...)"
        if isinstance(omega, (ConfigKeyError, ConfigAttributeError)) and key in MOVED:
            return f"{key}: moved (allowed: {MOVED[key]})"
        if isinstance(omega, (ConfigKeyError, ConfigAttributeError)) and key:
            within = _schema_class(message)  # "Key 'foo' not in 'LoraConfig'": a list item's keys
            if within is not None:
                outer = re.search(r"Could not override '([^']+)'|Error merging override [+~]*([\w.]+)=", str(exc))
                given = outer and (outer.group(1) or outer.group(2))
                if given and given != key and not key.startswith(given + "."):
                    key = f"{given}.{key}"  # the item's own full key is relative to the item

                return f"{key}: unknown key (allowed: {', '.join(field_types(within))})"
            siblings = _schema_keys(key)
            if siblings is not None:
                return f"{key}: unknown key (allowed: {', '.join(siblings)})"
        if isinstance(omega, ValidationError) and key and "(allowed" not in message:
            kind = _schema_kind(key)  # a value of the wrong type: say which type the key takes
            if kind:
                return f"{key}: {message} (allowed: {kind})"
        return f"{key}: {message}" if key else message
    if isinstance(exc, HydraException):
        return one_line(exc, None)
    if isinstance(exc, (ValueError, TypeError)) and _raised_in_hydra(exc):
        # e.g. "scheduler=0": Hydra checks a group override's type with a ValueError that names no key
        return _group_override(process.current().command_line) or one_line(exc, None)
    return None


def _group_override(argv: list[str]) -> Optional[str]:
    """``group=value: no such option (allowed: ...)`` for the first override of ``argv`` that picks
    no option of one of the package's config groups, or None."""
    conf = Path(__file__).resolve().parent.parent / "conf"
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = conf / key
        if sep and key and ".." not in key and group.is_dir() and not (group / f"{value}.yaml").is_file():
            options = ", ".join(sorted(p.stem for p in group.glob("*.yaml")))
            return f"{key}={value}: no such option (allowed: {options}{sampler_hint(key, value)})"
    return None


def sampler_hint(group: str, option: str) -> str:
    """``; heun is a sampler: sampler=heun`` where ``scheduler=`` names a sampler (config/samplers.py reads
    its A1111 and ComfyUI names), else ""."""
    from sdjax_runner.config import samplers
    from sdjax_runner.config.overrides import literal

    if group != "scheduler":
        return ""
    try:
        samplers.lookup(option)
    except UserError:
        return ""
    value = option if re.fullmatch(r"[\w.+-]+", option) else literal(option)
    return f"; {option} is a sampler: sampler={value}"


def _raised_in_hydra(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by Hydra itself (while composing the config from the overrides)."""
    traceback = exc.__traceback__
    last = None
    while traceback is not None:
        last, traceback = traceback, traceback.tb_next
    return last is not None and "/hydra/" in last.tb_frame.f_code.co_filename.replace("\\", "/")


def is_bad_input(exc: BaseException) -> bool:
    """Whether ``exc`` is input the user can fix (a UserError, a config refused): not a bug, a full disk or
    an interrupt."""
    return isinstance(exc, Exception) and not isinstance(exc, OSError) and describe(exc) is not None


def stop_reason(exc: BaseException) -> tuple[str, str]:
    """(tracker status, one-line reason) for whatever ended a job."""
    if isinstance(exc, KeyboardInterrupt):
        return "KILLED", "interrupted (SIGINT)"
    if isinstance(exc, Terminated):
        return "KILLED", "terminated (SIGTERM)"
    if isinstance(exc, SystemExit):
        return "KILLED", f"exited with status {exc.code}"
    return "FAILED", describe(exc) or f"{type(exc).__name__}: {exc}"
