"""``python -m sdjax_runner``: the Hydra application, with one-line errors for bad input.

Bad input -- a config Hydra cannot compose, or a value the plan rejects -- is
printed as ``error: <key>: <problem> (allowed: ...)`` with exit code 2 and no
traceback. ``HYDRA_FULL_ERROR=1`` brings the traceback back. Anything else
(a bug, an out-of-memory) keeps its traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sdjax_runner import console, internals, interpreter, process
from sdjax_runner.config import naming, schema, user_conf
from sdjax_runner.config.messages import describe, stop_reason
from sdjax_runner.config.prompts import file_replaces_texts
from sdjax_runner.errors import Refused, Terminated, stop_exit_status, stop_on_sigterm
from sdjax_runner.record.fresh_dirs import remove_refused
from sdjax_runner.record.sweep import abort, failure_message, job_label, read_sweep_file

# The configs travel inside the package (package data), so a wheel install finds them too.
CONFIG_MODULE = "sdjax_runner.conf"
BAD_INPUT_EXIT = 2
SWEEP_FAILED_EXIT = 1
log = logging.getLogger("sdjax_runner")


def _fail(message: str) -> None:
    console.error(message)
    sys.exit(BAD_INPUT_EXIT)


@hydra.main(version_base="1.3", config_path=f"pkg://{CONFIG_MODULE}", config_name="config")
def _app(cfg: DictConfig) -> dict:
    from sdjax_runner.runner import run

    hydra_cfg = HydraConfig.get()
    overrides = list(hydra_cfg.overrides.task)
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode != RunMode.MULTIRUN or hydra_cfg.job.num == 0:  # once a command
        for name in user_conf.shadowed(hydra_cfg.runtime.choices):
            log.info("config: conf/%s.yaml (yours) is used in place of the packaged %s", name, name)
    if hydra_cfg.mode != RunMode.MULTIRUN:
        try:
            return run(cfg, run_dir, overrides, run_name=naming.run_name(cfg.run_name, overrides))
        except Exception as exc:
            message = describe(exc)
            if message is None or process.current().show_tracebacks:
                raise
            remove_refused(run_dir)  # bad input found before the run started leaves no run behind
            _fail(message)
    # A sweep job: a child of the sweep's tracker run, named after the values it sweeps. A failed
    # job is recorded (status.json, FAILED tracker run) and the sweep goes on; the summary at the
    # end lists it and the command exits 1.
    sweep = read_sweep_file(Path(hydra_cfg.sweep.dir))
    name = f"{cfg.run_name} {job_label(overrides, sweep.get('swept_keys', []))}"
    try:
        return run(cfg, run_dir, overrides, run_name=name, parent_run_id=sweep.get("parent_run_id"))
    except Exception as exc:
        if process.current().show_tracebacks:
            raise
        log.error("error: %s", describe(exc) or f"{type(exc).__name__}: {exc}", exc_info=describe(exc) is None)
        return {"run_dir": str(run_dir), "error": str(exc)}


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def entry() -> NoReturn:
    """``python -m sdjax_runner`` and the ``sdjax-runner`` command: :func:`main`, then the process ends
    without the interpreter's teardown (:func:`.interpreter.exit_process`)."""
    try:
        main()
    except SystemExit as exc:
        interpreter.exit_process(exc.code)
    interpreter.exit_process(0)


def main() -> None:
    interpreter.pause_collection()  # start-up: see interpreter.py
    try:
        _main()
    finally:
        process.close()  # a launcher's workers and connections (sdjax_runner/launchers/)
        interpreter.job_ended()


def _main() -> None:
    schema.register()
    internals.compose_once()
    stop_on_sigterm()
    show_tracebacks = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Let Hydra pass its composition errors up instead of printing them itself.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    not_utf8 = next((arg for arg in sys.argv[1:] if not _is_utf8(arg)), None)
    if not_utf8 is not None:  # a shell passes any bytes; Hydra's parser would fail on them obscurely
        key = not_utf8.split("=", 1)[0] if "=" in not_utf8 else "argument"
        _fail(f"{key}: is not valid UTF-8: {not_utf8.encode('utf-8', 'backslashreplace').decode('ascii', 'replace')} "
              "(allowed: UTF-8 text)")
    sys.argv[1:] = file_replaces_texts(sys.argv[1:])
    process.start(sys.argv[1:], show_tracebacks)
    try:
        _app()
    except Refused as exc:
        abort(str(exc), "FAILED")  # refused once a sweep had started (its workers cannot see its directory)
        _fail(str(exc))
    except (KeyboardInterrupt, Terminated) as exc:
        reason = stop_reason(exc)[1]
        abort(reason)
        console.error(reason)
        sys.exit(stop_exit_status(exc))
    except Exception as exc:
        message = describe(exc)
        abort(message or f"{type(exc).__name__}: {exc}", "FAILED")  # a sweep that broke off leaves no RUNNING run
        if message is None or process.current().show_tracebacks:
            raise
        _fail(message)
    failed_sweep = failure_message()
    if failed_sweep:
        console.error(failed_sweep)
        sys.exit(SWEEP_FAILED_EXIT)
