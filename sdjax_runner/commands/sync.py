"""``python -m sdjax_runner sync PATH... [--uri URI]``: log runs the tracker missed.

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

from pathlib import Path
from typing import Optional

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.errors import UserError
from sdjax_runner.record import rundir
from sdjax_runner.record.backfill import run_dirs, sync_run
from sdjax_runner.record.tracking import MlflowTracker


def sync_parent(sweep_dir: Path, uri: Optional[str]) -> Optional[str]:
    """A multirun's parent run, if the tracker failed before the sweep could finish it."""
    from sdjax_runner.record.sweep import collect_jobs, log_parent, read_sweep_file

    if not (sweep_dir / rundir.SWEEP).exists():
        return None
    record = read_sweep_file(sweep_dir)
    if not record.get("parent_run_id") or record.get("parent_logged") is not False:
        return None
    cfg = rundir.recorded_config(run_dirs(sweep_dir)[0])
    tracker = MlflowTracker(cfg.tracking, cfg.paths.output_root, uri=uri)
    tracker.resume(record["parent_run_id"])
    log_parent(tracker, sweep_dir, collect_jobs(sweep_dir, record.get("swept_keys", [])))
    return f"sweep parent logged as {tracker.description}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = command_parser("sync", __doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--uri", help="tracking URI to log to (default: the run's own tracking config)")
    parser.add_argument("--assume-gone", action="store_true",
                        help="finish runs left RUNNING on another host as KILLED (their process cannot be checked)")
    args = parser.parse_args(argv)
    if args.uri:
        from sdjax_runner.config.checks import mlflow_uri

        try:
            mlflow_uri("--uri", args.uri, "no --uri for each run's own tracking config")
        except UserError as error:
            console.error(error)
            return 2
    failed = 0
    for path in args.paths:
        if not path.is_dir():
            console.error(f"{path}: no such directory")
            failed += 1
            continue
        for run_dir in run_dirs(path):
            try:
                console.say(f"{run_dir}: {sync_run(run_dir, args.uri, args.assume_gone)}")
            except UserError as exc:  # a damaged record (names the file and what it should be), a lookup refused
                console.error(exc)
                failed += 1
            except Exception as exc:  # one bad run must not stop the others
                console.error(f"{run_dir}: {type(exc).__name__}: {console.one_line(exc, 300)}")
                failed += 1
        if not failed:
            try:
                done = sync_parent(path, args.uri)
                if done:
                    print(f"{path}: {done}")
            except Exception as exc:
                console.error(f"{path}: {type(exc).__name__}: {console.one_line(exc, 300)}")
                failed += 1
    return 1 if failed else 0

