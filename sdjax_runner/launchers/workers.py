"""A sweep worker: one process that runs the sweep points it is given, one after another, as Hydra's basic
launcher would run them in the command's own process -- ``hydra.core.utils.run_job`` with the app's task
function, into ``SWEEP_DIR/N`` -- so its reuse cache (engine/reuse.py) serves every point after the first:
one load per model, one compile per program, however many points. A Ray actor (launchers/ray_sweep.py) and
an array task (launchers/array_tasks.py) are each one :class:`SweepWorker`.

Also here, what both launchers decide on the command's side: which points share a program
(:func:`program_signature`), which point a free worker takes next (:func:`next_point`), how points are split
into shares (:func:`shares`), and what a point whose worker died leaves on disk (:func:`finish_lost_point`).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from sdjax_runner import process
from sdjax_runner.console import one_line
from sdjax_runner.files import write_text
from sdjax_runner.record import rundir

log = logging.getLogger("sdjax_runner")

# The file the command writes into the sweep directory and every worker must read back before a point starts:
# a worker that cannot is on a host that does not share the sweep directory.
PROBE = ".workers_probe"

# Keys that never shape a compiled program (engine/program.Spec): traced inputs (the seed, the prompts, the
# guidance scale, the init image's strength) and what a job records. Two points that differ only in these
# share a program; anything else may not (a wrong guess costs a compile, never a wrong image).
NOT_PROGRAM_KEYS = ("seed", "run_name", "experiment", "output", "timing", "tracking", "metrics", "report", "paths",
                    "strength", "init_image", "mask_image", "reuse", "compilation_cache")
# (reference_images is not among them: how many there are shapes the program)
NOT_PROGRAM_SUBKEYS = {"sampling": ("guidance_scale",), "prompts": ("texts", "negative", "file", "fill"),
                       "controlnet": ("image", "conditioning_scale", "guidance_start", "guidance_end")}


@dataclass
class Point:
    """One point of a sweep: its job number, overrides, composed config and program signature."""

    number: int
    overrides: list[str]
    config: DictConfig
    signature: str
    attempt: int = 1


@dataclass
class WorkerSetup:
    """What a worker process needs to run jobs as the command would: Hydra's context (config loader,
    callbacks), the task function and Hydra's singletons, the command's working directory and line."""

    hydra_context: Any
    task_function: Any
    singleton_state: Any
    cwd: str
    command_line: list[str]
    show_tracebacks: bool
    env: dict[str, str] = field(default_factory=dict)


def program_signature(config: DictConfig) -> str:
    """The point's settings that may shape its program (all but :data:`NOT_PROGRAM_KEYS`), as one text."""
    job = OmegaConf.to_container(config, resolve=False)
    assert isinstance(job, dict)
    job.pop("hydra", None)
    for key in NOT_PROGRAM_KEYS:
        job.pop(key, None)
    for key, subkeys in NOT_PROGRAM_SUBKEYS.items():
        if isinstance(job.get(key), dict):
            for subkey in subkeys:
                job[key].pop(subkey, None)
    return repr(sorted(job.items(), key=lambda item: str(item[0])))


def next_point(pending: Sequence[Point], held: set[str], held_elsewhere: set[str]) -> Optional[Point]:
    """The point a free worker takes: the first whose program it holds; else the first whose program no
    other worker holds (a new program compiles where none is busy with it); else the first. None: none left."""
    if not pending:
        return None
    return (next((p for p in pending if p.signature in held), None)
            or next((p for p in pending if p.signature not in held_elsewhere), None) or pending[0])


def shares(points: Sequence[Point], count: int) -> list[list[Point]]:
    """``points`` split into at most ``count`` shares of nearly equal size, each point beside those of its
    program (grouped by signature in the order they first appear), in job order within a program."""
    order = {signature: i for i, signature in enumerate(dict.fromkeys(p.signature for p in points))}
    ordered = sorted(points, key=lambda p: (order[p.signature], p.number))
    count = max(1, min(count, len(ordered)))
    size, extra = divmod(len(ordered), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(ordered[start:end])
        start = end
    return [share for share in out if share]


def write_probe(sweep_dir: Path) -> str:
    """A random token in ``sweep_dir/.workers_probe``, for :meth:`SweepWorker.check_sees`."""
    token = uuid.uuid4().hex
    rundir.write_json(sweep_dir / PROBE, {"token": token})
    return token


def remove_probe(sweep_dir: Path) -> None:
    (sweep_dir / PROBE).unlink(missing_ok=True)


class SweepWorker:
    """A worker process (module docstring). Made once per process; :meth:`run` once per point."""

    def __init__(self, name: str, setup: WorkerSetup) -> None:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import setup_globals

        from sdjax_runner.config import schema

        self.name, self.setup = name, setup
        os.environ.update(setup.env)
        os.environ["HYDRA_FULL_ERROR"] = "1"  # as the run command sets it: composition errors reach the job's handler
        setup_globals()
        Singleton.set_state(setup.singleton_state)
        schema.register()
        state = process.start(setup.command_line, setup.show_tracebacks)
        state.worker = name
        self.cannot_see: Optional[str] = None
        try:
            os.chdir(setup.cwd)  # the command's relative paths (outputs/, conf/, model folders) mean the same here
        except OSError as exc:
            self.cannot_see = f"cannot enter the command's working directory {setup.cwd} ({exc.strerror})"

    def facts(self) -> dict[str, Any]:
        """Where this worker runs: its name, host, process id and the devices its environment gives it."""
        visible = {key: os.environ[key] for key in ("CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS", "XLA_FLAGS")
                   if os.environ.get(key)}
        return {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(), "visible": visible}

    def check_sees(self, sweep_dir: str, token: str) -> Optional[str]:
        """None if this worker reads the command's probe in ``sweep_dir``; else why not, in a few words."""
        if self.cannot_see:
            return self.cannot_see
        probe = Path(sweep_dir) / PROBE
        try:
            seen = rundir.read_record(probe).get("token")
        except rundir.DamagedRecord as exc:
            return one_line(exc, 200)
        return None if seen == token else f"reads another {probe} (not the same folder)"

    def run(self, number: int, config: DictConfig) -> Any:
        """Point ``number``, composed by the command (``config``), as a Hydra job: its JobReturn."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import run_job

        HydraConfig.instance().set_config(config)
        return run_job(hydra_context=self.setup.hydra_context, task_function=self.setup.task_function,
                       config=config, job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")

    def run_share(self, points: Sequence[tuple[int, DictConfig]]) -> list[Any]:
        """Each of ``points`` in turn (an array task's share)."""
        return [self.run(number, config) for number, config in points]


def compose_points(hydra_context: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]],
                   initial_job_idx: int) -> list[Point]:
    """Each job's config composed as Hydra's launchers compose it (job number and id set)."""
    from omegaconf import open_dict

    points = []
    for number, overrides in enumerate(job_overrides, start=initial_job_idx):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{number}"
            sweep_config.hydra.job.num = number
        points.append(Point(number, list(overrides), sweep_config, program_signature(sweep_config)))
    return points


def job_return(point: Point, sweep_dir: Path, error: Optional[str]) -> Any:
    """A JobReturn for a point that no worker returned one for (its worker died): what the app returns for a
    failed job, so the sweep goes on and its summary names the point."""
    from hydra.core.utils import JobReturn, JobStatus

    result = JobReturn(overrides=point.overrides, cfg=point.config, hydra_cfg=None, working_dir=str(sweep_dir),
                       task_name=str(point.config.hydra.job.name), status=JobStatus.COMPLETED)
    result.return_value = {"run_dir": str(sweep_dir / str(point.number)), "error": error}
    return result


def finish_lost_point(point: Point, sweep_dir: Path, reason: str) -> str:
    """A point whose worker died: a job directory left RUNNING is finished KILLED (as ``sync --assume-gone``
    would: images kept, the tracker run ended); one never started gets a FAILED record naming ``reason``, with
    its overrides, so the summary lists it and ``resume`` runs it. Returns the status it was left with."""
    from sdjax_runner.record.backfill import sync_run

    job_dir = sweep_dir / str(point.number)
    status = rundir.read_json_or_empty(job_dir / rundir.STATUS)
    if status.get("status") == "RUNNING":
        try:
            sync_run(job_dir, None, assume_gone=True, by=f"the sweep's launcher ({reason})")
        except Exception as exc:  # on disk it is KILLED already, or stays RUNNING for sync to finish later
            log.warning("sweep: job %d could not be finished in its tracker (%s)", point.number, one_line(exc, 200))
        return str(rundir.read_json_or_empty(job_dir / rundir.STATUS).get("status", "KILLED"))
    if status:
        return str(status.get("status"))
    (job_dir / rundir.HYDRA_DIR).mkdir(parents=True, exist_ok=True)
    write_text(job_dir / rundir.OVERRIDES, OmegaConf.to_yaml(OmegaConf.create(point.overrides)))
    rundir.write_json(job_dir / rundir.STATUS, {"status": "FAILED", "error": f"not run: {reason}"})
    return "FAILED"
