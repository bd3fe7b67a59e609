"""Every use of a private API of JAX (``jax._src``) or Hydra (``hydra._internal``), in one place: small named
functions that the rest of the package calls, and the release each was written and checked against
(:data:`INTERNALS`). A private API may change in any release, so on its first use in a process each function
compares the installed release (major.minor) with that table and, where they differ, logs one line per
package saying what may misbehave. Where the private attribute is missing entirely, each fails soft as the
package always has -- JAX behaves as shipped, a sweep's up-front check is skipped -- and says so in one line."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import process
from sdjax_runner.console import one_line
from sdjax_runner.files import untrusted, write_private

log = logging.getLogger("sdjax_runner")


@dataclass(frozen=True)
class Internal:
    package: str      # the distribution (``importlib.metadata`` name)
    written_for: str  # the release it was written and checked against; major.minor is compared
    uses: str         # the private API
    what: str         # what may misbehave where that API changed


INTERNALS = {
    "jax_cache_guard": Internal(
        "jax", "0.12.0.1", "jax._src.compilation_cache.get_executable_and_time, _get_cache; jax._src.lru_cache."
        "LRUCache.put, _CACHE_SUFFIX, _is_local_filesystem",
        "the compilation cache's entries written whole and damaged ones removed (compile_cache.guard_entries)"),
    "jax_cache_bypass": Internal(
        "jax", "0.12.0.1", "jax._src.compilation_cache._cache_checked, _cache_used, _cache_initialized_mutex",
        "programs compiled afresh, not from the compilation cache, to be stored whole (compile_cache.bypassed)"),
    "jax_backends_started": Internal(
        "jax", "0.12.0.1", "jax._src.xla_bridge.backends_are_initialized",
        "telling whether XLA flags set now still apply (engine/runtime.py)"),
    "hydra_apply_overrides": Internal(
        "hydra-core", "1.3.8", "hydra._internal.config_loader_impl.ConfigLoaderImpl._apply_overrides_to_config",
        "a sweep's values checked before it starts (config/sweep_points.py)"),
    "hydra_basic_sweeper": Internal(
        "hydra-core", "1.3.8", "hydra._internal.core_plugins.basic_sweeper.BasicSweeper, BasicSweeperConf",
        "hydra/sweeper=checked and resume, and the check of a sweep's points"),
    "hydra_get_mode": Internal(
        "hydra-core", "1.3.8", "hydra._internal.hydra.Hydra.get_mode, Hydra.config_loader.get_search_path",
        "a command's config composed once instead of twice (compose_once)"),
}

# Hydra's own name for its basic sweeper: a sweep's ``hydra.sweeper._target_``.
BASIC_SWEEPER_TARGET = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# The logger JAX's backend setup logs to (its platform-fallback notices), kept off the console.
JAX_BACKEND_LOGGER = "jax._src.xla_bridge"


class MissingInternal(RuntimeError):
    """A private API this package uses is not in the installed release (one line, naming it)."""


def installed_version(package: str) -> Optional[str]:
    """The installed release of ``package`` (a distribution name), or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _minor(version: Optional[str]) -> Optional[str]:
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{found.group(1)}.{found.group(2)}" if found else None


def check_version(package: str) -> Optional[str]:
    """Once per process per package: where the installed release of ``package`` differs (major.minor) from the
    one an entry of :data:`INTERNALS` was written for, one warning line naming both and what may misbehave;
    returns that line, or None (same releases, or already checked)."""
    said = process.current().said_once
    if f"version {package}" in said:
        return None
    said.add(f"version {package}")
    found = installed_version(package)
    differing = [entry for entry in INTERNALS.values()
                 if entry.package == package and _minor(found) != _minor(entry.written_for)]
    if not differing:
        return None
    written_for = " / ".join(dict.fromkeys(entry.written_for for entry in differing))
    line = (f"internals: {package} {found or 'not installed'} found, the use of its private API was written for "
            f"{package} {written_for}; may misbehave: {'; '.join(entry.what for entry in differing)}")
    log.warning(line)
    return line


def _use(name: str) -> Internal:
    entry = INTERNALS[name]
    check_version(entry.package)
    return entry


def _lookup(module: str, *names: str) -> tuple[Any, list[str]]:
    """The private module ``module`` and which of its ``names`` it lacks (``[module]`` where it is gone)."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None, [module]
    return found, [f"{module}.{name}" for name in names if not _has(found, name)]


def _has(owner: object, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def _missing(name: str, absent: list[str], instead: str = "") -> str:
    """The one line for a private API that is not there: logged, once per process and name, where ``instead``
    says what the package does then; returned for an exception's message."""
    entry = INTERNALS[name]
    line = (f"internals: {entry.package} {installed_version(entry.package) or 'not installed'} has no "
            f"{one_line(', '.join(absent), 300)}" + (f": {instead}" if instead else ""))
    said = process.current().said_once
    if instead and f"missing {name}" not in said:
        said.add(f"missing {name}")
        log.warning(line)
    return line


def guard_jax_cache_entries() -> bool:
    """JAX's persistent compilation cache made to survive a write cut short (see
    :func:`sdjax_runner.engine.compile_cache.guard_entries`); returns whether it could. Once per process;
    where JAX's internals are not what this expects, nothing changes (JAX behaves as shipped)."""
    _use("jax_cache_guard")
    import jax

    jax_cache, absent = _lookup("jax._src.compilation_cache", "get_executable_and_time", "_get_cache")
    lru_cache, absent_too = _lookup("jax._src.lru_cache", "LRUCache.put", "_CACHE_SUFFIX", "_is_local_filesystem")
    if absent or absent_too:
        _missing("jax_cache_guard", absent + absent_too, "the compilation cache's entries are written as JAX writes them")
        return False
    cls = lru_cache.LRUCache
    if getattr(cls, "_sdjax_guarded", False):
        return True
    read, write = jax_cache.get_executable_and_time, cls.put

    def local_entry(cache: object, key: str) -> Optional[Path]:
        root = getattr(cache, "path", None)
        if root is None or not lru_cache._is_local_filesystem(str(root)):
            return None
        return Path(os.fspath(root)) / f"{key}{lru_cache._CACHE_SUFFIX}"

    def get_executable_and_time(cache_key, compile_options, backend, *args, **kwargs):
        entry = local_entry(jax_cache._get_cache(backend), cache_key) if cache_key else None
        why = untrusted(entry, entry.parent) if entry is not None and os.path.lexists(entry) else None
        # An entry is machine code this process would run: never one someone else could plant.
        if why and entry is not None:
            with contextlib.suppress(OSError):
                entry.unlink()
            log.warning("compilation_cache: entry %s %s: not read, removed; compiling again", entry.name, why)
            return None, None
        try:
            return read(cache_key, compile_options, backend, *args, **kwargs)
        except Exception as exc:
            entry = local_entry(jax_cache._get_cache(backend), cache_key)
            if entry is None or getattr(jax.config, "jax_raise_persistent_cache_errors", False):
                raise
            with contextlib.suppress(OSError):
                entry.unlink(missing_ok=True)
            log.info("compilation_cache: entry %s could not be read (%s; cut short by a run killed or a disk "
                     "that filled up while writing it?): removed, compiling again", entry.name,
                     one_line(f"{type(exc).__name__}: {exc}", 120))
            return None, None

    def put(self, key: str, value: bytes) -> None:
        entry = local_entry(self, key)
        if entry is None or getattr(self, "eviction_enabled", True) or not key:
            return write(self, key, value)  # a remote cache, JAX's own eviction on, or no key: JAX's put as shipped
        if entry.exists():
            return None
        try:
            write_private(entry, value)  # whole, by rename, and 0600 whatever the umask
        except OSError as exc:
            if getattr(jax.config, "jax_raise_persistent_cache_errors", False):
                raise
            log.info("compilation_cache: entry %s not written (%s)", entry.name, one_line(exc, 120))
        return None

    jax_cache.get_executable_and_time = get_executable_and_time
    cls.put = put  # the guarded put replaces JAX's, on purpose
    cls._sdjax_guarded = True  # a marker of our own on JAX's class
    return True


@contextlib.contextmanager
def jax_cache_bypassed() -> Iterator[bool]:
    """JAX's persistent cache neither read nor written for the duration (yields whether it could): JAX decides
    once per process whether the cache is used, and this flips that decision (``compilation_cache._cache_used``);
    where that is absent, it does nothing."""
    _use("jax_cache_bypass")
    jax_cache, absent = _lookup("jax._src.compilation_cache", "_cache_used", "_cache_checked", "_cache_initialized_mutex")
    if absent:
        _missing("jax_cache_bypass", absent, "a program to be stored may be served by the compilation cache")
        yield False
        return
    with jax_cache._cache_initialized_mutex:
        saved = (jax_cache._cache_checked, jax_cache._cache_used)
        jax_cache._cache_checked, jax_cache._cache_used = True, False
    try:
        yield True
    finally:
        with jax_cache._cache_initialized_mutex:
            jax_cache._cache_checked, jax_cache._cache_used = saved


def jax_backends_started() -> bool:
    """Whether JAX has created its backends (after which XLA reads no flag again). Where JAX's private function
    is gone, False, said once: XLA flags are then set as before a start."""
    _use("jax_backends_started")
    xla_bridge, absent = _lookup("jax._src.xla_bridge", "backends_are_initialized")
    if absent:
        _missing("jax_backends_started", absent, "XLA flags are set as if JAX had not started (a later job's may not apply)")
        return False
    return bool(xla_bridge.backends_are_initialized())


def apply_hydra_overrides(overrides: list[Any], config: Any) -> None:
    """Hydra's own override semantics (``key=value``, ``+key=``, ``~key``) applied to ``config`` in place.
    :class:`MissingInternal` where Hydra no longer has them: config/sweep_points.py's caller then lets the
    sweep run unchecked, as for any failure of the check itself."""
    _use("hydra_apply_overrides")
    loader, absent = _lookup("hydra._internal.config_loader_impl", "ConfigLoaderImpl._apply_overrides_to_config")
    if absent:
        raise MissingInternal(_missing("hydra_apply_overrides", absent))
    loader.ConfigLoaderImpl._apply_overrides_to_config(overrides, config)


def hydra_basic_sweeper() -> tuple[Any, Any]:
    """Hydra's basic sweeper class and its config dataclass, which hydra/sweeper=resume extends. An ImportError
    naming them where Hydra no longer has them: Hydra's plugin scan then skips the resume sweeper with a
    warning, as it does any plugin that fails to import."""
    _use("hydra_basic_sweeper")
    module, absent = _lookup("hydra._internal.core_plugins.basic_sweeper", "BasicSweeper", "BasicSweeperConf")
    if absent:
        raise ImportError(_missing("hydra_basic_sweeper", absent))
    return module.BasicSweeper, module.BasicSweeperConf


# The config sources a command composes from when no one else's is on Hydra's search path: Hydra's own, the package's
# YAML and the structured configs (the schema, the plugins' options). None of them sets ``hydra.mode``
# (tests/test_configs.py composes every packaged experiment to check it).
PACKAGED_SOURCES = ("pkg://hydra.conf", "pkg://sdjax_runner.conf", "structured://")


def _may_set_mode(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0].strip()
    return key in ("hydra", "hydra.mode") or key.startswith("hydra/")


def compose_once() -> None:
    """Hydra composes a command's whole config twice: ``Hydra.get_mode`` composes it only to read ``hydra.mode`` (a
    config may make a plain command a sweep), then the run composes it again -- a third of an in-process command
    that stops at bad input. Where only the packaged sources are on the search path (no ``conf/`` of the user's, no
    ``--config-dir``) and no override names ``hydra.mode`` or a ``hydra/`` option, nothing can set it: the answer is
    Hydra's own for a config that sets none (None), without composing. Anywhere else Hydra composes as it does."""
    _use("hydra_get_mode")
    module, absent = _lookup("hydra._internal.hydra", "Hydra.get_mode")
    if absent:
        _missing("hydra_get_mode", absent, "each command's config is composed twice, as Hydra does")
        return
    hydra_class = module.Hydra
    if getattr(hydra_class.get_mode, "packaged_only", False):
        return
    composing = hydra_class.get_mode

    def get_mode(self: Any, config_name: Optional[str], overrides: list[str]) -> Any:
        try:
            sources = [element.path for element in self.config_loader.get_search_path().get_path()]
        except AttributeError:
            sources = [None]
        if all(source in PACKAGED_SOURCES for source in sources) and not any(map(_may_set_mode, overrides)):
            return None
        return composing(self, config_name, overrides)

    get_mode.packaged_only = True  # type: ignore[attr-defined]
    hydra_class.get_mode = get_mode
