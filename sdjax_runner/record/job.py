"""A job's lifecycle on disk and in the tracker: status.json and the tracker run follow it, RUNNING, then
FINISHED, FAILED or KILLED -- the tracker run is always ended, whatever ends the job."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.messages import describe, is_bad_input, stop_reason
from sdjax_runner.console import bounded, one_line
from sdjax_runner.errors import DISK_ERRORS
from sdjax_runner.record import rundir
from sdjax_runner.record.tracking import NullTracker, numeric_metrics
from sdjax_runner.records import ImageRecord, Quality, RunTimings

log = logging.getLogger("sdjax_runner")


class Job:
    """status.json and the tracker run of one job.

    The tracker starts only once the config has passed validation, so bad input leaves no
    tracker run behind -- but status.json still says why the job stopped (FAILED, with ``"refused":
    true`` where bad input stopped it before any image: runs list shows it as REFUSED). What the tracker is
    to receive is written to tracking.json first; if the tracker fails (a server down), the job
    goes on, status.json says ``"logged": false``, and ``python -m sdjax_runner sync`` logs it later.
    """

    def __init__(self, run_dir: Path, writes: bool = True, run_name: Optional[str] = None):
        self.run_dir = run_dir
        self.writes = writes  # False on processes other than 0 of a multi-host run
        self.tracker: Any = NullTracker()
        self.tracker_error: Optional[str] = None
        # Who runs it and since when: a later reader can tell a RUNNING job whose process is gone.
        self.status: dict[str, Any] = {"status": "RUNNING", "host": socket.gethostname(), "pid": os.getpid(),
                                       "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        if run_name:  # known before the config is checked: a job refused for bad input is listed by its name
            self.status["run_name"] = run_name
        self.progress: dict[str, Any] = {}  # timings so far (timings.json's keys), kept if the job stops early
        self.records: list[ImageRecord] = []  # the images written so far

    def write_status(self, **fields: Any) -> None:
        self.status.update(fields, tracking=self.tracker.description, run_id=self.tracker.run_id,
                           experiment_id=getattr(self.tracker, "experiment_id", None))  # (the UI's link needs both)
        if isinstance(self.tracker, NullTracker):
            self.status["logged"] = None  # tracking=none: nothing to log
        else:
            self.status["logged"] = self.tracker_error is None and self.status["status"] != "RUNNING"
            if self.tracker_error:
                self.status["tracking_error"] = self.tracker_error
        if self.writes:
            rundir.write_json(self.run_dir / rundir.STATUS, self.status, last_resort_in_place=True)

    def tracked(self, call: Callable[[], Any]) -> None:
        """A tracker call; the first failure is reported once and the tracker is left alone after."""
        if self.tracker_error is not None:
            return
        try:
            call()
        except Exception as exc:
            self.tracker_error = describe(exc) or f"{type(exc).__name__}: {exc}"
            log.warning("tracking failed, the run goes on and keeps everything in %s (log it later: "
                        "python -m sdjax_runner sync %s): %s", self.run_dir, self.run_dir,
                        one_line(self.tracker_error, 800))

    def start_tracker(self, tracker, run_name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        self.tracker = tracker
        self.status["run_name"] = run_name
        if self.writes and not isinstance(tracker, NullTracker):
            rundir.write_json(self.run_dir / rundir.TRACKING, {"run_name": run_name, "params": params, "tags": tags})
        self.tracked(lambda: tracker.start(run_name, params, tags))
        self.write_status()

    def finish(self, timings: RunTimings, quality: Quality) -> None:
        """The complete timings and quality metrics to disk, then the run's outputs to the tracker."""
        rundir.write_json(self.run_dir / rundir.QUALITY, quality.to_json())
        rundir.write_json(self.run_dir / rundir.TIMINGS, timings.to_json())
        self.progress.clear()  # complete: nothing partial to keep any more
        metrics = numeric_metrics({**timings.to_json(), **quality.to_json()})
        self.tracked(lambda: self.tracker.log_outputs(self.run_dir, metrics))

    def keep_partial(self) -> None:
        """A job stopped after it began generating: its timings so far (marked partial) and the
        records of the images it wrote, on disk and then to the tracker."""
        if not self.writes or not self.progress:
            return
        timings = RunTimings.from_json(self.progress)
        timings.partial = 1
        rundir.write_json(self.run_dir / rundir.TIMINGS, timings.to_json())
        rundir.write_image_records(self.run_dir, self.records)
        self.tracked(lambda: self.tracker.log_outputs(self.run_dir, numeric_metrics(timings.to_json())))

    def end_tracker(self, status: str, error: Optional[str] = None) -> None:
        error = bounded(error) if error else error  # as the console shows it: a 700 kB value does not travel whole
        self.tracked(lambda: self.tracker.end(status, error))
        self.write_status(status=status, **({"error": error} if error else {}))

    @contextlib.contextmanager
    def recorded(self) -> Iterator[Job]:
        from sdjax_runner.engine import distributed

        self.write_status()
        try:
            yield self
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.errno in DISK_ERRORS and not exc.filename:
                exc.filename = str(self.run_dir)  # PIL and friends write through file objects: say where
            status, error = stop_reason(exc)
            full_disk = isinstance(exc, OSError) and exc.errno in DISK_ERRORS
            # Bad input found before any image (a size the model cannot take, a LoRA for another model):
            # FAILED for the tracker, and "refused" for runs list, which leaves such runs out by default.
            refused = {"refused": True} if is_bad_input(exc) and not self.records else {}
            try:  # how it ended, first: a full disk may take nothing more
                self.write_status(status=status, error=error, **refused)
            except OSError as failure:
                log.warning("could not write %s: %s", rundir.STATUS, failure)
            if not full_disk:
                try:
                    self.keep_partial()
                except OSError as failure:
                    log.warning("could not keep the partial outputs: %s", failure)
            try:
                self.end_tracker(status, error)
            except OSError as failure:  # status.json unwritable: the one-line error still says why
                log.warning("could not write %s: %s", rundir.STATUS, failure)
            if status == "FAILED" and "jax" in sys.modules:
                distributed.agree(failed=True)
            raise
        if distributed.agree(failed=False):
            error = "another process of this multi-host run failed"
            self.end_tracker("FAILED", error)
            raise RuntimeError(error)
        self.end_tracker("FINISHED")
