"""What the Python interpreter itself costs a short run: garbage collection while it starts, and its
teardown at exit.

Measured on the smoke run (``docs/benchmarks.md``, time to first image): importing JAX, Flax,
diffusers and transformers builds a heap of ~400,000 objects, and CPython's cyclic collector walks
that whole heap again each time it grows by a quarter -- five full collections, ~0.35 s, before the
first image, none of which frees anything that matters. At exit, the interpreter's teardown (every
module's objects freed one by one, a last full collection, XLA's destructors) takes another
~0.6 s after the last file is written.

So a job's start-up runs with automatic collection paused; once its program is ready, the objects
made so far are frozen (``gc.freeze``: left out of later collections) and collection resumes; when
the job ends they are unfrozen, so anything among them that became garbage is collected as usual
(nothing is kept for good, also in a sweep's long process). And ``python -m sdjax_runner`` ends with
:func:`exit_process`, which does what the interpreter does first at any exit -- waits for threads
still at work (an upload, say) after running the thread pools' exit hooks, runs the ``atexit``
handlers (logging's flush and close, MLflow's, JAX's) and flushes the streams -- and then ends with
``os._exit``, skipping the teardown. Everything the runner writes is closed before that point (files
are written atomically and closed where they are opened).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from typing import NoReturn, Union

_paused = False
_frozen = False


def pause_collection() -> None:
    """Stop automatic cyclic collection until :func:`program_ready` or :func:`job_ended`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def program_ready() -> None:
    """Start-up is over: exempt the objects made so far from collection, and resume it."""
    global _paused, _frozen
    if _paused:
        gc.freeze()
        _frozen = True
        _paused = False
        gc.enable()


def job_ended() -> None:
    """Collection as usual again: frozen objects become collectable, a pause is lifted."""
    global _paused, _frozen
    if _frozen:
        gc.unfreeze()
        _frozen = False
    if _paused:
        _paused = False
        gc.enable()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed or broken pipe: nothing more to say there
            pass


def exit_process(code: Union[int, str, None]) -> NoReturn:
    """End the process with ``code`` (as ``sys.exit`` reads it), skipping the interpreter's teardown."""
    job_ended()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    code = 0 if code is None else int(code)
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None:  # not CPython's threading module: the normal exit
        sys.exit(code)
    _flush()
    shutdown()  # what the interpreter does first at exit: threading's exit hooks, then join non-daemon threads
    atexit._run_exitfuncs()  # then the exit handlers, in the same order
    _flush()
    os._exit(code)
