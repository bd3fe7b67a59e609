"""Running ``python -m sdjax_runner`` as a user does, and what its errors must look like."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

# What only a process of its own can run: an environment JAX, XLA, Python or Ray read when they start, another
# device count or XLA flags (this process's JAX has started with 8 CPU devices), launchers that start processes
# or clusters, multi-host runs, a cache directory of its own (JAX's persistent cache is set once per process).
PROCESS_ENV = ("XLA_", "JAX_", "PYTHON", "CUDA", "TPU", "RAY_", "LD_", "HYDRA_FULL_ERROR", "OMP_", "TF_", "HF_",
               "HUGGINGFACE")
PROCESS_OVERRIDES = ("performance.xla_flags", "performance.gpu_", "hydra/launcher=", "hydra.launcher.",
                     "parallelism.distributed", "compilation_cache.dir", "compilation_cache.enabled",
                     "compilation_cache.min_compile_time_s")


# For a run whose subject is not how the images are spread over devices: the smoke experiment's 8 images from one
# device in one call, where its 8 host devices make one each. On this suite's 2 cores a new program of the tiny
# model then compiles in 1.5-2 s instead of 3 (no SPMD partitioning of ~1,000 weight operands) and a call runs in a
# fifth of the time. Other images than the 8 devices' (each device draws from its own key), the same on every run.
ONE_DEVICE = ("parallelism.num_devices=1", "parallelism.per_device_batch_size=8")

# A run re-runs its batch 0 for a steady-state timing while that costs at most timing.max_extra_share (0.5) of
# the job so far: on a new program of the tiny model, three more calls (0.6-1.5 s, a tenth to a sixth of the
# run). run_cli leaves them out where a test reads no steady-state figure (``steady_timing=False``, the
# default for a run or sweep whose command line sets no ``timing.`` key): the images, records and every other
# figure are the same. The tests of the timing itself (test_timing.py, test_smoke_run.py, the sweeps' and the
# report's figures) keep a user's default.
NO_STEADY_TIMING = "timing.max_extra_share=0"


def needs_a_process(overrides: tuple[str, ...], env: dict | None) -> bool:
    """Whether a command needs a process of its own (PROCESS_ENV, PROCESS_OVERRIDES, a device count but 8)."""
    for override in overrides:
        key = override.lstrip("+~")
        if key.startswith(PROCESS_OVERRIDES) or (key.startswith("parallelism.host_device_count=")
                                                 and key != "parallelism.host_device_count=8"):
            return True
    return any(key.startswith(PROCESS_ENV) for key in env or {})


def run_cli(*overrides: str, cwd: Path, env: dict | None = None, timeout: int | None = None,
            command: str | None = None, process: bool | None = None,
            steady_timing: bool = False) -> subprocess.CompletedProcess:
    """``python -m sdjax_runner [COMMAND] OVERRIDES`` as a user runs it (COMMAND: runs, rerun, sync, resume, ...;
    none: a run or sweep). In a process of its own where the process is what is tested (``process=True``: the
    exit code the shell sees, no traceback from the interpreter, signals, what gets imported) or where the run
    needs one (:func:`needs_a_process`: its device count, XLA flags, launchers, a cache of its own, an
    environment JAX reads; a ``timeout``, which only a process can be held to); else in this process
    (:func:`call_cli`, with a process's state of its own: no model, program or said-once line carried over
    from another test), which saves Python's and JAX's start-up -- the import of the model libraries alone is
    ~3 s a call. A run or sweep makes no steady-state timing re-run unless ``steady_timing`` or its command line
    sets a ``timing.`` key or a Hydra flag (``--cfg``, ``--config-dir``, ...; :data:`NO_STEADY_TIMING`)."""
    timing_set = any(o.lstrip("+~").startswith(("timing.", "--")) for o in overrides)
    if command is None and not steady_timing and not timing_set:
        overrides = (*overrides, NO_STEADY_TIMING)
    if process is None:
        process = timeout is not None or needs_a_process(overrides, env)
    started = time.perf_counter()
    if not process:
        result = call_cli(*overrides, cwd=cwd, env=env, command=command)
    else:
        full_env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
        full_env.update(env or {})
        result = subprocess.run([sys.executable, "-m", "sdjax_runner", *([command] if command else []), *overrides],
                                cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout or 300)
    if os.environ.get("SDJAX_TEST_PROCESS_LOG"):  # which tests run what, where and for how long (the suite's time)
        with open(os.environ["SDJAX_TEST_PROCESS_LOG"], "a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{'process' if process else 'in-process'}\t"
                      f"{time.perf_counter() - started:.2f}\t{command or ''}\t{' '.join(overrides)[:400]}\n")
    return result


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 2, no traceback, one line on stderr starting with ``expected``."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(expected), errors[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call_cli(*overrides: str, cwd: Path, env: dict | None = None,
             command: str | None = None) -> subprocess.CompletedProcess:
    """``python -m sdjax_runner [COMMAND] OVERRIDES`` in this process, for bad input the checks refuse before
    anything loads: the dispatcher's own :func:`sdjax_runner.commands.entry`, with ``sys.argv``, the working
    directory and the environment as :func:`run_cli` sets them, standard output and error captured, and the exit
    status the process would end with (:func:`sdjax_runner.interpreter.exit_process`, which ends the process
    without the interpreter's teardown, raises ``SystemExit`` instead). Milliseconds where a process costs
    seconds (Python's start, the imports). The result reads as :func:`run_cli`'s, so
    :func:`assert_one_line_error` checks it alike. What only a process shows -- the exit code the shell sees, no
    traceback from the interpreter, what gets imported, XLA flags read by a JAX that has not started -- stays
    with tests that use :func:`run_cli` (a few per command).

    What a command changes in the process is put back: ``sys.argv``, the working directory, the environment,
    every signal's handler (SIGTERM's, SIGPIPE's, ...: a child process inherits an ignored signal), Hydra's run
    config, the loggers' handlers and levels. Hydra configures logging for a
    run with ``dictConfig``, which also closes every handler the process has (pytest's, absl's, whose stream
    is pytest's capture): they are set aside during the call."""
    import contextlib
    import io
    import logging

    from hydra.core.hydra_config import HydraConfig

    from sdjax_runner import commands, interpreter, process

    def exit_here(code) -> None:  # exit_process's reading of the status, ending with SystemExit instead
        interpreter.job_ended()
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        raise SystemExit(0 if code is None else int(code))

    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    saved_loggers = [(logger, logger.level, logger.handlers[:], logger.propagate, logger.disabled)
                     for logger in loggers]
    saved_handlers = (dict(logging._handlers), logging._handlerList[:])
    logging._handlers.clear()
    del logging._handlerList[:]
    saved_argv, saved_cwd, saved_env = sys.argv[:], os.getcwd(), dict(os.environ)
    saved_signals = signal_handlers()
    saved_hydra_config = HydraConfig.instance().cfg
    saved_exit = interpreter.exit_process
    saved_state = process.current()
    process._state = fresh_state(saved_state)
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["sdjax_runner", *([command] if command else []), *overrides]
    for key in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI"):
        os.environ.pop(key, None)
    os.environ.update(env or {})
    sys.argv = argv[:]
    interpreter.exit_process = exit_here
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                commands.entry()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        process.close()  # what the command left to stop (a launcher's workers), as a process ending would
        process._state = saved_state
        os.chdir(saved_cwd)
        interpreter.exit_process = saved_exit
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        restore_signal_handlers(saved_signals)
        HydraConfig.instance().cfg = saved_hydra_config
        for logger, level, handlers, propagate, disabled in saved_loggers:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate, logger.disabled = propagate, disabled
        logging._handlers.clear()
        logging._handlers.update(saved_handlers[0])
        logging._handlerList[:] = saved_handlers[1]
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


def fresh_state(state):
    """A process's state as a new process starts with it -- no engine, models, programs, CLIP scorers, lines said
    once, claimed folders or sweep results of an earlier command -- but for what JAX holds once per process
    whatever the command (its persistent-cache settings and the events it reported, multi-host initialisation),
    the signing keys read (a cache folder's key is its file's) and the FLOPs of the denoiser calls counted
    (engine/efficiency.call_flops: a pure function of the module, its inputs' shapes and the backend, which
    costs a trace of the whole denoiser, ~0.5 s on the tiny UNet, and whose value no test's run can change)."""
    from sdjax_runner import process

    return process.ProcessState(compile_cache=state.compile_cache, compile_events=state.compile_events,
                                distributed=state.distributed, signing_keys=state.signing_keys,
                                executable_max_bytes=state.executable_max_bytes, call_flops=state.call_flops)


def signal_handlers() -> dict:
    """Every signal's handler in this process that Python can read and set."""
    import signal

    handlers = {}
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handlers[number] = signal.getsignal(number)
        except (OSError, ValueError):
            continue
    return handlers


def restore_signal_handlers(saved: dict) -> list:
    """Put back the handlers of ``saved`` (:func:`signal_handlers`) that changed; returns the signals that had."""
    import signal

    changed = [number for number, handler in signal_handlers().items()
               if number in saved and handler != saved[number] and saved[number] is not None]
    for number in changed:
        signal.signal(number, saved[number])
    return changed
