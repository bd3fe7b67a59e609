"""JAX's persistent compilation cache: configuring it, counting the compiles it served, having its
entries written whole (and a damaged one removed), and keeping the whole cache directory (JAX's
entries and the stored executables) under its size bound."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from sdjax_runner import internals, process
from sdjax_runner.config.schema import CompilationCacheConfig
from sdjax_runner.engine import executable_cache
from sdjax_runner.files import private_folder

log = logging.getLogger("sdjax_runner")

HIT = "/jax/compilation_cache/cache_hits"


def _count(event: str, **_: object) -> None:
    process.current().compile_events[event] += 1


def configure(cache: CompilationCacheConfig) -> None:
    """Point JAX at the cache directory, once per process (JAX reads the settings at its first compile)."""
    import jax
    from jax import monitoring

    directory = str(Path(cache.dir).expanduser().resolve()) if cache.enabled else None
    wanted = (directory, float(cache.min_compile_time_s), max_bytes(cache))
    state = process.current()
    if state.compile_cache is not None:
        if state.compile_cache != wanted:
            log.warning("compilation_cache: this process keeps dir=%s, min_compile_time_s=%s, max bytes=%s",
                        *state.compile_cache)
        return
    monitoring.register_event_listener(_count)
    executable_cache.bound(wanted[2])
    if directory:
        guard_entries()
        private_folder(Path(directory))
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", wanted[1])
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    state.compile_cache = wanted


def guard_entries() -> bool:
    """Make JAX's persistent cache survive a write cut short (returns whether it could). JAX (0.10 to 0.12 at
    least) writes an entry in place and never rewrites one that exists, so a process killed, or a disk
    filled, while writing one leaves a truncated entry that every later process fails to read: a
    two-line warning, and the program compiled again, for good. Here a local entry is written whole
    or not at all (a temporary file, renamed), a failed write is one log line, and an entry that
    cannot be read is removed, so the compile that follows stores a good one. Once per process;
    where JAX's internals are not what this expects, nothing changes (JAX behaves as shipped)."""
    return internals.guard_jax_cache_entries()


@contextlib.contextmanager
def bypassed() -> Iterator[bool]:
    """Compile afresh, without reading or writing JAX's persistent cache (yields whether it could).
    For a program the executable cache is to keep: an executable the persistent cache served does
    not survive serialization (see executable_cache). JAX has no public switch for one compile, and
    it decides once per process whether the cache is used: this flips that decision for the
    duration (``compilation_cache._cache_used``: sdjax_runner/internals.py); where that is absent, it does nothing."""
    with internals.jax_cache_bypassed() as bypassing:
        yield bypassing


def max_bytes(cache: CompilationCacheConfig) -> Optional[int]:
    """``compilation_cache.max_size_gb`` in bytes, or None (no bound)."""
    return None if cache.max_size_gb is None else int(cache.max_size_gb * 1e9)


def configured() -> bool:
    """Whether this process has set JAX's cache up (a job got that far)."""
    return process.current().compile_cache is not None


def hits() -> int:
    """Compiles served from the persistent cache so far in this process."""
    return process.current().compile_events[HIT]


# What trim() counts and removes: JAX's entries (``<key>-cache``, with the ``<key>-atime`` file JAX
# keeps beside one when its own eviction is on) and the stored executables (``executables/<key>.pkl``,
# with their ``.flops.json``).
_ENTRIES = (("*-cache", ("-cache", "-atime")), (f"{executable_cache.SUBDIR}/*.pkl", (".pkl", ".flops.json")))


def trim(cache: CompilationCacheConfig) -> list[Path]:
    """Remove the least recently used entries until ``cache.dir`` holds at most ``cache.max_size_gb``;
    returns what was removed. Recency is a file's last access or modification, whichever is later: a
    stored executable's is renewed at each load; JAX's entries' access times are the filesystem's
    (``relatime``: the first read after a write, then once a day; ``noatime``: write time only).
    Not JAX's own ``jax_compilation_cache_max_size``: it needs an access-time file beside every entry
    and fails every later write into a cache made without them (any earlier cache). Entries another
    process removes meanwhile are skipped; nothing here fails a run. Writes abandoned an hour ago or
    more go first (see _abandoned_writes)."""
    bound_bytes = max_bytes(cache)
    if not cache.enabled or bound_bytes is None:
        return []
    root = Path(cache.dir).expanduser()
    abandoned = _abandoned_writes(root)
    entries = []
    for pattern, (suffix, *endings) in _ENTRIES:
        for path in root.glob(pattern):
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((max(stat.st_atime_ns, stat.st_mtime_ns), path, stat.st_size,
                            [path.with_name(path.name[:-len(suffix)] + c) for c in endings]))
    total, removed = sum(entry[2] for entry in entries), []
    for _, path, size, companions in sorted(entries, key=lambda entry: entry[:2]):
        if total <= bound_bytes:
            break
        try:
            path.unlink(missing_ok=True)
            for companion in companions:
                companion.unlink(missing_ok=True)
        except OSError:
            continue
        total -= size
        removed.append(path)
    if removed:
        log.info("compilation_cache: removed %d least recently used entr%s to stay under %s GB", len(removed),
                 "y" if len(removed) == 1 else "ies", f"{cache.max_size_gb:g}")
    return abandoned + removed


ABANDONED_AFTER_S = 3600.0  # no entry takes an hour to write: an older temporary file's writer was killed


def _abandoned_writes(root: Path) -> list[Path]:
    """Temporary files of entries being written (``*.tmp``, renamed into place when whole) that have
    not changed for an hour: left by a process killed while writing, they would sit outside the
    bound's count forever."""
    import time

    removed = []
    for path in [*root.glob("*.tmp"), *root.glob(f"{executable_cache.SUBDIR}/*.tmp")]:
        try:
            if time.time() - path.stat().st_mtime > ABANDONED_AFTER_S:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed
