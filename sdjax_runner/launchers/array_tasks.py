"""``hydra/launcher=slurm_workers`` and ``local_workers``: a multirun's points split into
``hydra.launcher.num_workers`` shares, each run by one submitit array task -- one process
(:class:`.workers.SweepWorker`, the Ray workers' code) that runs its share with one load and one compile per
program. Points of one program go to the same share (:func:`.workers.shares`). ``slurm_workers`` submits the
tasks to SLURM (every sbatch setting of hydra-submitit-launcher's ``submitit_slurm`` applies);
``local_workers`` runs them as local processes through submitit's local executor, the same code path.

A task that ends early (killed, preempted, out of time) leaves the point it ran KILLED and its unstarted
points FAILED ("not run"); the others' points finish, the summary names them and ``resume`` runs them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sdjax_runner import process
from sdjax_runner.console import one_line
from sdjax_runner.launchers.workers import (
    Point,
    SweepWorker,
    WorkerSetup,
    compose_points,
    finish_lost_point,
    job_return,
    shares,
)
from sdjax_runner.record import rundir

log = logging.getLogger("sdjax_runner")


def run_task(name: str, setup: WorkerSetup, share: Sequence[tuple[int, DictConfig]]) -> list[Any]:
    """One array task: a worker made in this process, then its share of points in turn."""
    return SweepWorker(name, setup).run_share(share)


def launch(launcher: Any, executor: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """The points in ``num_workers`` array tasks on ``executor`` (a submitit executor, its parameters set);
    their JobReturns in job order."""
    from hydra.core.singleton import Singleton

    config = launcher.config
    sweep_dir = Path(str(config.hydra.sweep.dir))
    current = process.current()
    setup = WorkerSetup(launcher.hydra_context, launcher.task_function, Singleton.get_state(), os.getcwd(),
                        current.command_line, current.show_tracebacks)
    points = compose_points(launcher.hydra_context, config, job_overrides, initial_job_idx)
    split = shares(points, int(launcher.num_workers))
    names = [f"array task {i}" for i in range(len(split))]
    jobs = executor.map_array(run_task, names, [setup] * len(split),
                              [[(p.number, p.config) for p in share] for share in split])
    for name, job, share in zip(names, jobs, split, strict=True):
        log.info("%s: submitit job %s runs job(s) %s", name, job.job_id, ", ".join(str(p.number) for p in share))
    placeholder = Path(str(executor.folder))  # submitit makes a folder of its pattern itself (a literal "%j")
    wait_saying(jobs, points, sweep_dir, placeholder.parent if "%" in placeholder.name else placeholder)
    if "%" in placeholder.name and placeholder.is_dir() and not any(placeholder.iterdir()):
        placeholder.rmdir()  # (empty once the tasks have ended: nothing of theirs lies there)
    results: dict[int, Any] = {}
    for name, job, share in zip(names, jobs, split, strict=True):
        results.update(collect(name, job, share, sweep_dir))
    return [results[p.number] for p in points]


PROGRESS_EVERY_S = 15.0


def wait_saying(jobs: list[Any], points: list[Point], sweep_dir: Path, logs: Path) -> None:
    """Wait for the array tasks, saying what is awaited: at once, whenever a point finishes, and every
    PROGRESS_EVERY_S seconds -- how many points are done, how many tasks still run, where their own logs are (a
    task that loads and compiles said nothing here for 25 s before)."""
    import time

    def finished() -> int:
        return sum(rundir.read_json_or_empty(sweep_dir / str(p.number) / rundir.STATUS).get("status") in
                   ("FINISHED", "FAILED", "KILLED") for p in points)

    said, last = -1, 0.0
    while True:
        running = sum(not job.done() for job in jobs)
        done = finished()
        if running == 0:
            return
        if done != said or time.monotonic() - last >= PROGRESS_EVERY_S:
            log.info("sweep: %d of %d point(s) done; waiting for %d array task(s) (loading, compiling, generating: "
                     "their own logs in %s)", done, len(points), running, logs)
            said, last = done, time.monotonic()
        time.sleep(0.5)


def collect(name: str, job: Any, share: list[Point], sweep_dir: Path) -> dict[int, Any]:
    """A task's JobReturns; for a task that ended early, its points as it left them (finished, KILLED, or FAILED
    not run) -- the sweep goes on."""
    try:
        returned = job.results()[0]
        return {point.number: result for point, result in zip(share, returned, strict=True)}
    except Exception as exc:  # submitit's FailedJobError / UncompletedJobError: the process ended early
        reason = f"{name} (submitit job {job.job_id}) ended early ({one_line(exc, 160)})"
    log.warning("sweep: %s; its unfinished point(s) are left for python -m sdjax_runner resume %s", reason, sweep_dir)
    results = {}
    for point in share:
        status = finish_lost_point(point, sweep_dir, reason)
        results[point.number] = job_return(point, sweep_dir, None if status == "FINISHED" else f"{reason}; left {status}")
    return results
