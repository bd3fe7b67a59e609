"""What ``python -m sdjax_runner sync`` does for one run directory, as a library the commands share
(``sync``, ``resume``): log a run the tracker missed, and finish a run whose process died without a word."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional

from sdjax_runner.record import rundir
from sdjax_runner.record.tracking import MlflowTracker, numeric_metrics
from sdjax_runner.records import RunTimings


def run_dirs(path: Path) -> list[Path]:
    if (path / rundir.STATUS).exists():
        return [path]
    return sorted((p for p in path.iterdir() if (p / rundir.STATUS).exists()), key=lambda p: p.name)


def process_gone(status: dict) -> Optional[bool]:
    """Whether the process that runs this job has ended: True/False on the host that runs it,
    None elsewhere (or for a record without host and pid)."""
    if status.get("host") != socket.gethostname() or not isinstance(status.get("pid"), int):
        return None
    try:
        os.kill(status["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    cmdline = Path(f"/proc/{status['pid']}/cmdline")
    try:  # a reused pid: alive, but not this runner
        return b"sdjax_runner" not in cmdline.read_bytes()
    except OSError:
        return False


def finish_dead_run(run_dir: Path, status: dict, by: str = "python -m sdjax_runner sync") -> str:
    """A run left RUNNING by a process that died (SIGKILL, out of memory, power): images.json rebuilt
    from its PNGs, status.json KILLED. Returns what was kept."""
    records, unreadable = rundir.records_from_pngs(run_dir)
    rundir.write_image_records(run_dir, records)
    error = (f"the process ({status.get('host')}, pid {status.get('pid')}) ended without finishing the run "
             f"(killed, out of memory or power lost); finished by {by}")
    status.update(status="KILLED", error=error)
    if unreadable:
        status["unreadable_images"] = unreadable
    rundir.write_json(run_dir / rundir.STATUS, status)
    kept = f"{len(records)} image(s) kept" + (f", {len(unreadable)} cut short" if unreadable else "")
    return f"KILLED: its process is gone; {kept}, images.json rebuilt from the PNGs"


def sync_run(run_dir: Path, uri: Optional[str], assume_gone: bool = False, by: str = "python -m sdjax_runner sync"
             ) -> str:
    status = rundir.read_record(run_dir / rundir.STATUS)
    finished = ""
    if status["status"] == "RUNNING":
        gone = process_gone(status)
        if gone is False or (gone is None and not assume_gone):
            where = f"on {status.get('host')} (pid {status.get('pid')})"
            return (f"skipped: still running {where}" if gone is False else
                    f"skipped: RUNNING {where}, which cannot be checked from here (--assume-gone finishes it)")
        finished = finish_dead_run(run_dir, status, by) + "; "
        if not (run_dir / rundir.TRACKING).exists():
            return finished + "nothing to log (tracking=none)"
        status["logged"] = False
    if status.get("logged") is not False:
        return "already logged" if status.get("logged") else "nothing to log (tracking=none)"
    cfg = rundir.recorded_config(run_dir)
    intended = rundir.read_json(run_dir / rundir.TRACKING)
    tracker = MlflowTracker(cfg.tracking, cfg.paths.output_root, uri=uri)
    uid = intended["tags"]["sdjax.run_uid"]
    existing = status.get("run_id") or tracker.find_run("sdjax.run_uid", uid)
    if existing:
        tracker.resume(existing)
    else:
        tracker.start(intended["run_name"], intended["params"], intended["tags"])
    timings_file = run_dir / rundir.TIMINGS
    timings = RunTimings.from_json(rundir.read_json(timings_file)) if timings_file.exists() else RunTimings()
    metrics = numeric_metrics(timings.to_json())
    tracker.log_outputs(run_dir, metrics)
    tracker.end(status["status"], status.get("error"))
    status.update(logged=True, run_id=tracker.run_id, tracking=tracker.description)
    status.pop("tracking_error", None)
    rundir.write_json(run_dir / rundir.STATUS, status)
    return f"{finished}logged as {tracker.description}"
