"""Running ``python -m sdjax_runner`` as a user does, and what its errors must look like."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def run_cli(*overrides: str, cwd: Path, env: dict | None = None, timeout: int = 300,
            command: str | None = None) -> subprocess.CompletedProcess:
    """``python -m sdjax_runner [COMMAND] OVERRIDES`` in a subprocess, as a user runs it (COMMAND: runs,
    rerun, sync, resume; none: a run or sweep)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "sdjax_runner", *([command] if command else []), *overrides], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


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
    the SIGTERM handler, Hydra's run config, the loggers' handlers and levels. Hydra configures logging for a
    run with ``dictConfig``, which also closes every handler the process has (pytest's, absl's, whose stream
    is pytest's capture): they are set aside during the call."""
    import contextlib
    import io
    import logging
    import signal

    from hydra.core.hydra_config import HydraConfig

    from sdjax_runner import commands, interpreter

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
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    saved_hydra_config = HydraConfig.instance().cfg
    saved_exit = interpreter.exit_process
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
        os.chdir(saved_cwd)
        interpreter.exit_process = saved_exit
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        signal.signal(signal.SIGTERM, saved_sigterm)
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
