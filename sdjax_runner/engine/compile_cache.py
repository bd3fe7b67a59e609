"""JAX's persistent compilation cache, and counting the compiles it served."""

from __future__ import annotations

import collections
import contextlib
import logging
from pathlib import Path
from typing import Iterator, Optional

from omegaconf import DictConfig

log = logging.getLogger("sdjax_runner")

HIT = "/jax/compilation_cache/cache_hits"
_events: collections.Counter = collections.Counter()
_settings: Optional[tuple] = None  # what this process configured; JAX reads it at its first compile


def _count(event: str, **_: object) -> None:
    _events[event] += 1


def configure(cache: DictConfig) -> None:
    """Point JAX at the cache directory, once per process."""
    global _settings
    import jax
    from jax import monitoring

    directory = str(Path(cache.dir).expanduser().resolve()) if cache.enabled else None
    wanted = (directory, float(cache.min_compile_time_s))
    if _settings is not None:
        if _settings != wanted:
            log.warning("compilation_cache: this process keeps dir=%s, min_compile_time_s=%s", *_settings)
        return
    monitoring.register_event_listener(_count)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", wanted[1])
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _settings = wanted


@contextlib.contextmanager
def bypassed() -> Iterator[bool]:
    """Compile afresh, without reading or writing JAX's persistent cache (yields whether it could).
    For a program the executable cache is to keep: an executable the persistent cache served does
    not survive serialization (see executable_cache). JAX has no public switch for one compile, and
    it decides once per process whether the cache is used: this flips that decision for the
    duration (jax 0.10's ``compilation_cache._cache_used``); where that is absent, it does nothing."""
    from jax._src import compilation_cache as jax_cache

    if not hasattr(jax_cache, "_cache_used") or not hasattr(jax_cache, "_cache_checked"):
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


def hits() -> int:
    """Compiles served from the persistent cache so far in this process."""
    return _events[HIT]
