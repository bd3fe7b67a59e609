"""Data is data: values that come from an image's infotext, a record or a folder someone hands you reach the
config as literals, and what a record asks to replay is checked against what the runner itself writes.

* :func:`literal` quotes a text so that Hydra's override grammar and OmegaConf's interpolation both give
  back exactly that text: no ``${...}`` is resolved, no quote, comma or bracket is read as grammar.
* :func:`replayable` checks the overrides of a recorded command (``multirun.yaml``, ``.hydra/overrides.yaml``)
  before ``resume`` or ``rerun`` repeats them: the task overrides of config keys, the launcher and sweeper,
  and the few Hydra settings the runner writes; never a ``_target_``, a Hydra callback, another Hydra key,
  or a resolver call (``${oc.env:...}``) -- a record holds values, not lookups.
* :func:`check_recorded_config` does the same for a recorded config (``.hydra/config.yaml``): a resolver call
  is allowed only where the packaged config has that very value under that key (``paths.cache_dir``'s
  ``${oc.env:SDJAX_RUNNER_CACHE_DIR,...}``); a reference to another key (``${model.name}``) is a value.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Any

from sdjax_runner.errors import UserError

# An interpolation that is not escaped: ``${`` after an even number of backslashes (OmegaConf's rule).
_OPEN = re.compile(r"(\\*)\$\{")
# What a plain reference to another key looks like inside ``${...}``: no resolver call.
_REFERENCE = re.compile(r"\s*[\w.\[\]-]*\s*\}")


def literal(text: str) -> str:
    """``text`` as a single-quoted Hydra override value that composes to exactly ``text``.

    Two grammars read it: Hydra's (in a quoted value only a quote, the backslashes before it and those at
    the end are special) and then OmegaConf's (``${`` opens an interpolation unless escaped as ``\\${``; a
    backslash before that escape is itself escaped). Each ``${`` is escaped for OmegaConf first, then the
    whole for Hydra."""
    text = _OPEN.sub(lambda m: m.group(1) * 2 + "\\${", str(text))
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


def interpolations(text: str) -> Iterator[str]:
    """The unescaped interpolations in ``text``, each from its ``${`` to the end of the text."""
    for match in _OPEN.finditer(text):
        if len(match.group(1)) % 2 == 0:
            yield text[match.end() - 2:]


def calls_a_resolver(text: str) -> bool:
    """Whether ``text`` holds an interpolation that is not a plain reference to another key: a resolver
    call (``${oc.env:HOME}``, ``${now:...}``) or anything nested."""
    return any(not _REFERENCE.match(found[2:]) for found in interpolations(text))


# ---------------------------------------------------------------------------------------------- replaying
# Hydra's own settings a recorded command may carry: what the runner and its commands write (a claimed run
# or sweep directory, the sweep mode), a launcher's parameters and Hydra's verbosity. Config groups of
# Hydra's: a launcher or sweeper by name, its logging configs.
HYDRA_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.mode", "hydra.verbose",
              "hydra.job.chdir", "hydra.sweeper.max_batch_size", "hydra.launcher.")
HYDRA_GROUPS = ("hydra/launcher", "hydra/sweeper", "hydra/job_logging", "hydra/hydra_logging")
_NAME = re.compile(r"[\w.-]+")


def replayable(overrides: Iterable[str], source: str, task_keys: Iterable[str]) -> list[str]:
    """``overrides`` as they are, if each is one the runner could have recorded (see the module docstring);
    otherwise :class:`UserError` naming ``source`` (e.g. ``SWEEP/multirun.yaml``), the override and what is
    allowed. ``task_keys``: the config's top-level keys and groups a task override may set."""
    tops = set(task_keys)
    out = []
    for override in overrides:
        if not isinstance(override, str):
            raise UserError(source, f"holds an override that is not text ({type(override).__name__})",
                            "key=value overrides")
        why = _why_not_replayable(override, tops)
        if why:
            raise UserError(source, f"{why}; it is not replayed: {override[:200]!r}",
                            "overrides of config keys, hydra/launcher, hydra/sweeper, "
                            + ", ".join(k + ("*" if k.endswith(".") else "") for k in HYDRA_KEYS)
                            + "; literal values only")
        out.append(override)
    return out


def _why_not_replayable(override: str, tops: set[str]) -> str:
    key, sep, value = override.partition("=")
    key = key.lstrip("+~")
    if "_target_" in override:
        return "a _target_ (an object Hydra would build: code from data)"
    if key.startswith(("hydra.callbacks", "hydra/callbacks")):
        return "a Hydra callback (code from data)"
    if calls_a_resolver(value):
        return "a resolver call (${...:...}) that would read this machine's state"
    if key.startswith("hydra/"):
        allowed = key in HYDRA_GROUPS and _NAME.fullmatch(value) is not None
        return "" if allowed else "a Hydra config group this runner does not record"
    if key.startswith("hydra.") or key == "hydra":
        allowed = any(key == k or (k.endswith(".") and key.startswith(k)) for k in HYDRA_KEYS)
        return "" if allowed else "a Hydra setting this runner does not record"
    if not sep and not override.startswith("~"):
        return "not a key=value override"
    top = re.split(r"[./]", key, maxsplit=1)[0]
    return "" if top in tops else "a key the config does not have"


# A launcher's settings a recorded sweep may replay: how many workers, what each takes from a cluster or a queue,
# how long to wait, names and accounts -- none of them starts a program, changes a process's environment or sends
# the work to another machine. Everything else under hydra.launcher (Ray's env and address, submitit's setup lines,
# additional_parameters and folder, joblib's temp_folder, a python or an executable, keys a later launcher adds)
# is taken from the resume command line only, never from a folder someone may have handed you.
REPLAYED_LAUNCHER_KEYS = frozenset({
    "num_workers", "resources", "connect_timeout_s", "start_timeout_s", "retries",  # ray, *_workers
    "timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name", "stderr_to_stdout",
    "partition", "qos", "comment", "constraint", "exclude", "gres", "cpus_per_gpu", "gpus_per_task", "mem_per_gpu",
    "mem_per_cpu", "account", "signal_delay_s", "max_num_timeout", "array_parallelism",  # submitit
    "n_jobs", "backend", "prefer", "require", "verbose", "timeout", "pre_dispatch", "batch_size", "max_nbytes",
    "mmap_mode",  # joblib
})
LAUNCHER = "hydra.launcher."
# A replayed launcher value: words, numbers and Hydra's list/dict brackets -- no newline, quote or shell character
# that could end a line of the batch script submitit writes (#SBATCH --comment=...) and start another.
_LAUNCHER_VALUE = re.compile(r"[\w .,:@%+/=\-\[\]{}]*")


def launcher_key(override: str) -> str:
    """The setting a ``hydra.launcher.*`` override sets (``env`` for ``+hydra.launcher.env.PATH=...``); "" for
    any other override."""
    key = override.partition("=")[0].lstrip("+~")
    return key[len(LAUNCHER):].split(".", 1)[0] if key.startswith(LAUNCHER) else ""


def launcher_settings_replayed(overrides: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the overrides to replay, the ``hydra.launcher.*`` keys left out): a launcher setting is replayed only if
    it is one of REPLAYED_LAUNCHER_KEYS with a plain value."""
    kept, dropped = [], []
    for override in overrides:
        name = launcher_key(override)
        if name and (name not in REPLAYED_LAUNCHER_KEYS
                     or not _LAUNCHER_VALUE.fullmatch(override.partition("=")[2])):
            dropped.append(override.partition("=")[0].lstrip("+~"))
        else:
            kept.append(override)
    return kept, dropped


# ---------------------------------------------------------------------------------------- recorded configs
@functools.lru_cache(maxsize=1)
def packaged_interpolations() -> frozenset[tuple[str, str]]:
    """(key name, value) of every value of the packaged configs that calls a resolver
    (``("cache_dir", "${oc.env:SDJAX_RUNNER_CACHE_DIR,...}")``)."""
    import yaml

    found: set[tuple[str, str]] = set()
    for path in _yaml_files(resources.files("sdjax_runner.conf")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        found.update((name, value) for _, name, value in _leaves(data) if isinstance(value, str) and calls_a_resolver(value))
    return frozenset(found)


def _yaml_files(folder: Any) -> Iterator[Any]:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _yaml_files(entry)
        elif entry.name.endswith(".yaml"):
            yield entry


def _leaves(node: Any, path: str = "", name: str = "") -> Iterator[tuple[str, str, Any]]:
    """(full key, key name, value) of every leaf of a config as plain data; a list's items are named by the
    list's key (``prompts.texts.0``'s name is ``texts``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key), str(key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _leaves(item, f"{path}.{index}", name)
    else:
        yield path, name, node


def recorded_resolver_calls(data: Any) -> Iterator[tuple[str, str]]:
    """(full key, value) of each value of a recorded config (plain data) that calls a resolver where the
    packaged config does not."""
    allowed = packaged_interpolations()
    for path, name, value in _leaves(data):
        if isinstance(value, str) and calls_a_resolver(value) and (name, value) not in allowed:
            yield path, value


def check_recorded_config(data: Any, source: str) -> None:
    """:class:`UserError` naming the first key of a recorded config that calls a resolver the packaged
    config does not (``prompts.texts.0: ${oc.env:AWS_SECRET}``): a record's values are repeated, its
    lookups are not made on this machine."""
    for key, value in recorded_resolver_calls(data):
        raise UserError(source, f"{key} is {value[:120]!r}, a resolver call the packaged config does not make "
                        "there; a record is re-run with its values, never with lookups on this machine",
                        "literal values, references to other keys (${model.name}), the packaged config's own")
