"""``python -m sdjax_runner.sync PATH... [--uri URI]``: log runs the tracker missed.

A run whose tracker was unreachable (``"logged": false`` in its status.json) kept everything
on disk, including ``tracking.json`` -- the run name, params and tags it meant to log. This
logs such runs now: the run (found again by its ``sdjax.run_uid`` tag if an earlier sync got
part-way, so nothing is duplicated), its metrics and artifacts, and its final status. PATH is
a run directory or a multirun directory (its job directories are synced). Running it twice
logs nothing twice.

It also finishes runs whose process died without a word (SIGKILL, out of memory, power lost):
a run still RUNNING in status.json whose process (``host``, ``pid`` there) is gone is marked
KILLED, its images.json rebuilt from its PNGs' text chunks, and its tracker run ended KILLED
with what is on disk. A run RUNNING on another host cannot be checked from here: it is skipped
unless ``--assume-gone`` is given.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from sdjax_runner.record import rundir
from sdjax_runner.record.tracking import MlflowTracker, numeric_metrics


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


def finish_dead_run(run_dir: Path, status: dict, by: str = "python -m sdjax_runner.sync") -> str:
    """A run left RUNNING by a process that died (SIGKILL, out of memory, power): images.json rebuilt
    from its PNGs, status.json KILLED. Returns what was kept."""
    records, unreadable = rundir.records_from_pngs(run_dir)
    rundir.write_json(run_dir / rundir.IMAGES, records)
    error = (f"the process ({status.get('host')}, pid {status.get('pid')}) ended without finishing the run "
             f"(killed, out of memory or power lost); finished by {by}")
    status.update(status="KILLED", error=error)
    if unreadable:
        status["unreadable_images"] = unreadable
    rundir.write_json(run_dir / rundir.STATUS, status)
    kept = f"{len(records)} image(s) kept" + (f", {len(unreadable)} cut short" if unreadable else "")
    return f"KILLED: its process is gone; {kept}, images.json rebuilt from the PNGs"


def sync_run(run_dir: Path, uri: Optional[str], assume_gone: bool = False, by: str = "python -m sdjax_runner.sync"
             ) -> str:
    status = rundir.read_json(run_dir / rundir.STATUS)
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
    cfg = OmegaConf.load(run_dir / rundir.CONFIG)
    intended = rundir.read_json(run_dir / rundir.TRACKING)
    tracker = MlflowTracker(cfg.tracking, cfg.paths.output_root, uri=uri)
    uid = intended["tags"]["sdjax.run_uid"]
    existing = status.get("run_id") or tracker.find_run("sdjax.run_uid", uid)
    if existing:
        tracker.resume(existing)
    else:
        tracker.start(intended["run_name"], intended["params"], intended["tags"])
    timings_file = run_dir / rundir.TIMINGS
    metrics = numeric_metrics(rundir.read_json(timings_file)) if timings_file.exists() else {}
    tracker.log_outputs(run_dir, metrics)
    tracker.end(status["status"], status.get("error"))
    status.update(logged=True, run_id=tracker.run_id, tracking=tracker.description)
    status.pop("tracking_error", None)
    rundir.write_json(run_dir / rundir.STATUS, status)
    return f"{finished}logged as {tracker.description}"


def sync_parent(sweep_dir: Path, uri: Optional[str]) -> Optional[str]:
    """A multirun's parent run, if the tracker failed before the sweep could finish it."""
    from sdjax_runner.record.sweep import collect_jobs, log_parent, read_sweep_file

    if not (sweep_dir / rundir.SWEEP).exists():
        return None
    record = read_sweep_file(sweep_dir)
    if not record.get("parent_run_id") or record.get("parent_logged") is not False:
        return None
    cfg = OmegaConf.load(run_dirs(sweep_dir)[0] / rundir.CONFIG)
    tracker = MlflowTracker(cfg.tracking, cfg.paths.output_root, uri=uri)
    tracker.resume(record["parent_run_id"])
    log_parent(tracker, sweep_dir, collect_jobs(sweep_dir, record.get("swept_keys", [])))
    return f"sweep parent logged as {tracker.description}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdjax_runner.sync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--uri", help="tracking URI to log to (default: the run's own tracking config)")
    parser.add_argument("--assume-gone", action="store_true",
                        help="finish runs left RUNNING on another host as KILLED (their process cannot be checked)")
    args = parser.parse_args(argv)
    if args.uri:
        from sdjax_runner.config.checks import mlflow_uri
        from sdjax_runner.errors import UserError

        try:
            mlflow_uri("--uri", args.uri, "no --uri for each run's own tracking config")
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    failed = 0
    for path in args.paths:
        if not path.is_dir():
            print(f"error: {path}: no such directory", file=sys.stderr)
            failed += 1
            continue
        for run_dir in run_dirs(path):
            try:
                print(f"{run_dir}: {sync_run(run_dir, args.uri, args.assume_gone)}")
            except Exception as exc:  # one bad run must not stop the others
                print(f"error: {run_dir}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
                failed += 1
        if not failed:
            try:
                done = sync_parent(path, args.uri)
                if done:
                    print(f"{path}: {done}")
            except Exception as exc:
                print(f"error: {path}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
