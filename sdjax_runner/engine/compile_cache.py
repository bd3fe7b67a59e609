"""JAX's persistent compilation cache, and counting the compiles it served."""

from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Optional

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


def hits() -> int:
    """Compiles served from the persistent cache so far in this process."""
    return _events[HIT]
