"""What this process keeps between jobs, in one place: one :class:`ProcessState` (:func:`current`), made on
first use; the run command records its start-up settings in it (:func:`start`). Hydra's basic launcher runs
a sweep's jobs one after another in one process, so what is expensive to make -- the engine's models and
compiled programs, the CLIP scorers -- is kept here, with the settings the process was configured with
(JAX's caches, multi-host initialisation: JAX holds those once per process) and what a sweep under way
needs at its end. The layers above put their own objects in it, typed where they are made and read
(``engine.engine.current()``, ``metrics.clip_score.load_scorer``): this module names none of their types, not even
for a type checker, so it closes no import circle (tests/test_layers.py). The interpreter's garbage-collection state is the one exception: it mirrors the
``gc`` module's own, in interpreter.py."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass
class ProcessState:
    """This process's state (module docstring)."""

    # Start-up: the run command's arguments (prompt files read in), for messages that name an override, and
    # HYDRA_FULL_ERROR=1 (errors raise with their traceback instead of one line).
    command_line: list[str] = field(default_factory=list)
    show_tracebacks: bool = False
    # engine/: the models, placed weights and programs it holds (engine/engine.py, engine/reuse.py).
    engine: Any = None  # engine.engine.Engine, made and typed by engine.engine.current()
    # engine/compile_cache.py: the persistent cache settings JAX was given (it reads them at its first
    # compile) and the cache events JAX reported (hits).
    compile_cache: Optional[tuple] = None
    compile_events: collections.Counter = field(default_factory=collections.Counter)
    # engine/executable_cache.py: the signing key read per cache folder, the size bound of a stored executable.
    signing_keys: dict[str, bytes] = field(default_factory=dict)
    executable_max_bytes: Optional[int] = None
    distributed: Optional[tuple] = None  # engine/distributed.py: the multi-host settings it was initialised with
    shapes_dir: Optional[Path] = None  # models/checkpoints.py: where module shapes are kept; None: not kept
    # metrics/: CLIP scorers ((formula, source, ..., devices) -> ClipScorer, made and typed by clip_score.load_scorer)
    # and CMMD embedders (("cmmd", folder) -> cmmd.ClipEmbedder), loaded once per process
    clip_scorers: dict[tuple, Any] = field(default_factory=dict)
    # metrics/cmmd.py: a reference folder's embeddings, by the model and each image's path, size and mtime: a sweep's
    # jobs find them without hashing the folder's images again
    cmmd_references: dict[tuple, Any] = field(default_factory=dict)
    # engine/efficiency.py: XLA's FLOP count of a denoiser call, by module, function, shapes and backend.
    call_flops: dict[tuple, Optional[float]] = field(default_factory=dict)
    hinted_prompts: set[tuple] = field(default_factory=set)  # config/prompts.py: prompts a syntax hint named
    # record/fresh_dirs.py: run folders this process made, with the parents it made for them (removed again
    # if the run is refused).
    claimed_dirs: dict[Path, list[Path]] = field(default_factory=dict)
    # record/sweep.py: what the last sweep ended with (the exit status reads it) and the parent run of a sweep
    # under way (an interrupt ends it: Hydra skips on_multirun_end).
    sweep_result: dict[str, Any] = field(default_factory=dict)
    open_sweep_parent: list[Any] = field(default_factory=list)
    said_once: set[str] = field(default_factory=set)  # internals.py: version and missing-API lines already said
    # launchers/: this process as a sweep worker (a Ray actor, an array task): its name ("ray worker 2"), which
    # each job records; None: the command's own process.
    worker: Optional[str] = None
    # launchers/: what must be stopped when the command ends (a launcher's workers, its Ray connection);
    # the run command calls each once, last first.
    closers: list[Callable[[], None]] = field(default_factory=list)


_state = ProcessState()


def current() -> ProcessState:
    return _state


def close() -> None:
    """Call the closers (last registered first), each once; one that fails does not stop the others."""
    while _state.closers:
        closer = _state.closers.pop()
        try:
            closer()
        except Exception:  # a worker already gone, a connection already closed
            pass


def start(command_line: list[str], show_tracebacks: bool) -> ProcessState:
    """The run command's start-up settings, recorded (what the process holds is kept)."""
    _state.command_line, _state.show_tracebacks = list(command_line), show_tracebacks
    return _state
