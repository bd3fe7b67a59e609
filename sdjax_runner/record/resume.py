"""Resuming a sweep that did not finish (a preempted TPU VM, a killed process, a node lost, Ctrl-C):
the same sweep into the same directory, launching only the jobs that did not finish there.

``python -m sdjax_runner resume SWEEP_DIR`` runs the sweep's recorded command again (its overrides,
Hydra overrides, ``--config-dir`` and working directory, from ``multirun.yaml``) with
``hydra.sweep.dir=SWEEP_DIR hydra/sweeper=resume``. Then, before anything runs:

* the directory must be that sweep's: ``sweep.json`` with the same overrides (so Hydra numbers the
  jobs the same way), and no job of it may still be running;
* a job that did not finish (FAILED, KILLED, or RUNNING with its process gone) is finished the way
  ``python -m sdjax_runner sync`` finishes it -- status.json and its tracker run end KILLED with what
  it had -- and moved to ``SWEEP_DIR/earlier_attempts/N/``, so job ``N`` runs again into a fresh
  directory (a run directory holds one run);
* FINISHED jobs are not launched (the sweeper skips them; their directories are not touched);
* the sweep's MLflow parent run is reopened, so new jobs join it as children, and at the end the
  summary, contact sheet and report are made again from every job directory.
"""

from __future__ import annotations

import datetime
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from sdjax_runner.console import one_line
from sdjax_runner.errors import Refused
from sdjax_runner.record import rundir

log = logging.getLogger("sdjax_runner")

SWEEPER = "hydra_plugins.sdjax_runner_resume.resume_sweeper.ResumeSweeper"
EARLIER = "earlier_attempts"


def resuming(config: DictConfig) -> bool:
    """Whether this multirun resumes a sweep (``hydra/sweeper=resume``)."""
    return OmegaConf.select(config, "hydra.sweeper._target_") == SWEEPER


def job_status(job_dir: Path) -> dict[str, Any]:
    return rundir.read_json_or_empty(job_dir / rundir.STATUS)


def prepare(sweep_dir: Path, task_overrides: list[str]) -> None:
    """Check that ``sweep_dir`` holds this sweep and that none of its jobs runs; finish and move aside
    the jobs that did not finish. Bad input raises :class:`Refused` before anything is changed."""
    from sdjax_runner.record.backfill import process_gone

    key = "hydra.sweep.dir"
    record_file = sweep_dir / rundir.SWEEP
    if not record_file.is_file():
        raise Refused(f"{key}: {sweep_dir} holds no sweep to resume (no {rundir.SWEEP}) "
                      "(allowed: the directory of a multirun, outputs/multiruns/DATE/TIME_NAME)")
    try:
        recorded = rundir.read_record(record_file).get("overrides")
    except rundir.DamagedRecord as error:
        raise Refused(f"{key}: {error}") from None
    if recorded != task_overrides:
        raise Refused(f"{key}: {sweep_dir} holds another sweep: it ran {' '.join(recorded or [])!r}, this is "
                      f"{' '.join(task_overrides)!r} (allowed: the sweep's own overrides; python -m "
                      "sdjax_runner resume SWEEP_DIR repeats them)")
    unfinished = []
    for job_dir in rundir.job_dirs(sweep_dir):
        status = job_status(job_dir)
        if status.get("status") == "FINISHED":
            continue
        if status.get("status") == "RUNNING":
            gone = process_gone(status)
            if gone is False:
                raise Refused(f"{key}: job {job_dir.name} of {sweep_dir} is still running (pid {status.get('pid')}); "
                              "resume a sweep once its process has ended")
            if gone is None:
                raise Refused(f"{key}: job {job_dir.name} of {sweep_dir} is RUNNING on {status.get('host')}, which "
                              f"cannot be checked from here; if it has ended, finish it first: python -m "
                              f"sdjax_runner sync {job_dir} --assume-gone")
        unfinished.append((job_dir, status))
    for job_dir, status in unfinished:
        if status:
            finish_and_log(job_dir)
        moved = aside(sweep_dir, job_dir)
        log.info("resume: job %s %s, moved to %s; it runs again", job_dir.name,
                 f"ended {job_status(moved).get('status', 'UNKNOWN')}" if status else "has no status", moved)


def finish_and_log(job_dir: Path) -> None:
    """As ``python -m sdjax_runner sync JOB_DIR``: a dead RUNNING job ends KILLED, and what the tracker
    missed is logged. A tracker failure is a warning: the job is on disk."""
    from sdjax_runner.record.backfill import sync_run

    try:
        sync_run(job_dir, None, by="python -m sdjax_runner resume")
    except Exception as exc:
        log.warning("resume: job %s could not be synced to the tracker (%s); it stays on disk", job_dir.name,
                    one_line(exc, 200))


def aside(sweep_dir: Path, job_dir: Path) -> Path:
    """Move ``job_dir`` to ``earlier_attempts/N`` (``N.2``, ``N.3``, ... for later attempts)."""
    target = sweep_dir / EARLIER / job_dir.name
    attempt = 1
    while target.exists():
        attempt += 1
        target = sweep_dir / EARLIER / f"{job_dir.name}.{attempt}"
    target.parent.mkdir(exist_ok=True)
    shutil.move(str(job_dir), str(target))
    return target


def resumed_at(record: dict[str, Any]) -> list[str]:
    """The sweep record's ``resumed_at``, with now added."""
    return record.get("resumed_at", []) + [datetime.datetime.now().astimezone().isoformat(timespec="seconds")]


class SkipFinished:
    """A Hydra launcher that launches the jobs of a batch whose directories did not finish, in runs
    of consecutive jobs, so each keeps its job number (and so its directory)."""

    def __init__(self, launcher: Any, sweep_dir: Path) -> None:
        self.launcher = launcher
        self.sweep_dir = sweep_dir

    def finished(self, number: int, overrides: Sequence[str]) -> bool:
        job_dir = self.sweep_dir / str(number)
        if job_status(job_dir).get("status") != "FINISHED":
            return False
        recorded = rundir.job_overrides(job_dir)
        if recorded is None:  # its .hydra/ removed or damaged: the sweep's overrides were checked, its status stands
            return True
        if recorded != list(overrides):  # the sweep's overrides were checked: this cannot differ, unless edited
            raise Refused(f"hydra.sweep.dir: job {number} of {self.sweep_dir} ran {' '.join(recorded)!r}, not "
                          f"{' '.join(overrides)!r}; it cannot be resumed as the same sweep")
        return True

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        returns: list[Any] = []
        pending: list[Sequence[str]] = []
        start: Optional[int] = None
        for number, overrides in enumerate(job_overrides, start=initial_job_idx):
            if self.finished(number, overrides):
                if pending:
                    returns += self.launcher.launch(pending, initial_job_idx=start)
                    pending = []
                log.info("resume: job %d (%s) finished in an earlier attempt; kept", number, " ".join(overrides))
                continue
            if not pending:
                start = number
            pending.append(overrides)
        if pending:
            returns += self.launcher.launch(pending, initial_job_idx=start)
        return returns
