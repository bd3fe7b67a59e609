"""``hydra/launcher=ray``: a multirun's points on ``num_workers`` long-lived Ray actors, each one process
(:class:`.workers.SweepWorker`) with its own devices that loads and compiles once however many points it runs.

The command connects to a running cluster (``hydra.launcher.address``, else ``RAY_ADDRESS``) or starts a
local one bound to this host's loopback address, starts the workers, checks that each one sees the sweep
directory, then hands out the points: a free worker takes the next point of a program it holds, else one of a
program no other worker holds, else the next (:func:`.workers.next_point`). A worker that dies (killed, out of
memory, its node lost) leaves its point KILLED; the point runs again on another worker up to
``hydra.launcher.retries`` times (said once in the log, the first attempt kept in ``earlier_attempts/N``) and
the dead worker is replaced while points remain. Ctrl-C (or SIGTERM) stops the workers, finishes the points
they were running as KILLED and leaves the rest for ``resume``. docs/guides/clusters.md is the guide.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import process
from sdjax_runner.config.launchers import RayLauncherSettings, check_capacity, cluster_address, is_loopback
from sdjax_runner.console import one_line, shown
from sdjax_runner.errors import Refused, Terminated
from sdjax_runner.launchers.workers import (
    Point,
    SweepWorker,
    WorkerSetup,
    compose_points,
    finish_lost_point,
    job_return,
    next_point,
    remove_probe,
    write_probe,
)
from sdjax_runner.record import resume

log = logging.getLogger("sdjax_runner")

# After Ctrl-C: how long the command waits for the killed workers' points to end before finishing them.
STOP_WAIT_S = 10.0


@dataclass
class Worker:
    """One Ray actor as the command sees it: its handle, where it runs, what it holds and runs."""

    number: int
    actor: Any
    facts: dict[str, Any] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)  # program signatures it has run
    point: Optional[Point] = None
    ref: Any = None

    @property
    def where(self) -> str:
        return f"{self.facts.get('host', '?')}, pid {self.facts.get('pid', '?')}"


class RayPool:
    """The command's connection and its workers, kept across the sweeper's batches until the command ends."""

    def __init__(self, settings: RayLauncherSettings, setup: WorkerSetup, sweep_dir: Path) -> None:
        self.settings, self.setup, self.sweep_dir = settings, setup, sweep_dir
        self.workers: list[Worker] = []
        self.started = 0  # workers started, replacements included
        self.actor_class: Any = None

    # -- start and stop --------------------------------------------------------------------------------

    def connect(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray sends no usage report from here
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every worker's console lines, not "repeated 3x" (read at import)
        address = cluster_address(self.settings.address)
        if address is None or is_loopback(address):
            held_to_loopback()
        if address is None:  # token authentication, said so (Ray warns on stderr where the mode is not given)
            os.environ.setdefault("RAY_AUTH_MODE", "token")
        import ray

        try:
            if address is None:
                ray.init(include_dashboard=False, configure_logging=False, log_to_driver=True)
            else:
                ray.init(address=address, configure_logging=False, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:  # an address that answers but is no Ray head
            raise Refused(f"hydra.launcher.address: {address or 'a local cluster'}: Ray could not connect: "
                          f"{one_line(str(exc).split(chr(10))[0], 300)} (allowed: a running Ray head's address, "
                          "with its RAY_AUTH_TOKEN where the cluster uses token authentication)") from None
        have = ray.cluster_resources()
        log.info("ray: %s (%s)", f"connected to {address}" if address else "started a local cluster on this host",
                 describe_resources(have))
        short = check_capacity(self.settings, self.settings.num_workers, have, local=address is None)
        if short and address is None:  # a cluster of this host's alone: nothing will join it
            ray.shutdown()
            raise Refused(f"hydra.launcher.resources: {short} (allowed: fewer workers, hydra.launcher.num_workers, or "
                          "less each)")
        if short:
            log.warning("ray: %s; the workers wait for an autoscaler up to hydra.launcher.start_timeout_s=%g s", short,
                        self.settings.start_timeout_s)
        process.current().closers.append(self.close)
        self.actor_class = ray.remote(SweepWorker)

    def start_workers(self, count: int) -> list[Worker]:
        """``count`` more workers, each started and checked to see the sweep directory (Refused otherwise)."""
        import ray
        from ray.exceptions import GetTimeoutError

        token = write_probe(self.sweep_dir)
        new = []
        for _ in range(count):
            self.started += 1
            actor = self.actor_class.options(**self.actor_options()).remote(f"ray worker {self.started}",
                                                                            self.setup)
            new.append(Worker(self.started, actor))
        try:
            checks = ray.get([w.actor.check_sees.remote(str(self.sweep_dir.resolve()), token) for w in new],
                             timeout=self.settings.start_timeout_s)
            facts = ray.get([w.actor.facts.remote() for w in new], timeout=self.settings.start_timeout_s)
        except GetTimeoutError:
            for worker in new:
                ray.kill(worker.actor)
            raise Refused(f"hydra.launcher.resources: {describe_resources(self.settings.resources)} per worker: the "
                          f"cluster did not start {count} such worker(s) within {self.settings.start_timeout_s:g} s "
                          f"(allowed: what the cluster has, {describe_resources(ray.cluster_resources())}, or a longer "
                          "hydra.launcher.start_timeout_s)") from None
        finally:
            remove_probe(self.sweep_dir)
        for worker, problem, fact in zip(new, checks, facts, strict=True):
            worker.facts = fact
            if problem:
                for other in new:
                    ray.kill(other.actor)
                raise Refused(f"hydra.sweep.dir: {self.sweep_dir.resolve()} is not shared with the Ray workers: "
                              f"{worker.facts['name']} on {worker.facts['host']} {problem} (allowed: a sweep directory, "
                              "working directory and model folders on a filesystem every worker's host mounts at the "
                              "same path; see docs/guides/clusters.md)")
            log.info("ray: %s on %s (pid %d)%s", fact["name"], fact["host"], fact["pid"],
                     "".join(f", {k}={v}" for k, v in fact["visible"].items()))
        self.workers += new
        return new

    def actor_options(self) -> dict[str, Any]:
        resources = dict(self.settings.resources)
        options: dict[str, Any] = {"num_cpus": resources.pop("CPU", 1), "max_restarts": 0, "max_concurrency": 1}
        if "GPU" in resources:
            options["num_gpus"] = resources.pop("GPU")
        if "memory" in resources:
            options["memory"] = resources.pop("memory")
        if resources:
            options["resources"] = resources
        if self.settings.env:
            options["runtime_env"] = {"env_vars": dict(self.settings.env)}
        return options

    def close(self) -> None:
        import ray

        for worker in self.workers:
            try:
                ray.kill(worker.actor)
            except Exception:
                pass
        self.workers = []
        ray.shutdown()

    # -- the points --------------------------------------------------------------------------------------

    def run(self, points: list[Point]) -> list[Any]:
        """Every point on the workers; their JobReturns in job order."""
        pending = collections.deque(points)
        results: dict[int, Any] = {}
        try:
            self.dispatch(pending, results)
        except (KeyboardInterrupt, Terminated):
            self.stop_on_interrupt()
            raise
        return [results[p.number] for p in points]

    def dispatch(self, pending: collections.deque[Point], results: dict[int, Any]) -> None:
        import ray

        while True:
            self.hand_out(pending)
            busy = {w.ref: w for w in self.workers if w.point is not None}
            if not busy:
                for point in pending:  # no worker left and none could be started
                    status = finish_lost_point(point, self.sweep_dir, "no Ray worker was left to run it")
                    results[point.number] = job_return(point, self.sweep_dir, f"not run: no Ray worker left ({status})")
                return
            ready, _ = ray.wait(list(busy), num_returns=1)
            for ref in ready:
                self.collect(busy[ref], pending, results)

    def hand_out(self, pending: collections.deque[Point]) -> None:
        if pending and len(self.workers) < self.settings.num_workers and self.started < self.max_starts:
            self.start_workers(min(self.settings.num_workers - len(self.workers), self.max_starts - self.started))
        for worker in self.workers:
            if worker.point is None and pending:
                elsewhere = set().union(*(w.held | ({w.point.signature} if w.point else set())
                                          for w in self.workers if w is not worker))
                point = next_point(pending, worker.held, elsewhere)
                assert point is not None
                pending.remove(point)
                worker.point, worker.ref = point, worker.actor.run.remote(point.number, point.config)

    @property
    def max_starts(self) -> int:
        """Workers started in all: the first ``num_workers`` and as many replacements."""
        return 2 * self.settings.num_workers

    def collect(self, worker: Worker, pending: collections.deque[Point], results: dict[int, Any]) -> None:
        import ray
        from ray.exceptions import RayActorError

        point = worker.point
        assert point is not None
        worker.point, ref, worker.ref = None, worker.ref, None
        try:
            results[point.number] = ray.get(ref)
            worker.held.add(point.signature)
            return
        except RayActorError as exc:
            reason = f"its worker, {worker.facts.get('name')} ({worker.where}), died ({one_line(exc, 120)})"
        self.workers.remove(worker)
        status = finish_lost_point(point, self.sweep_dir, reason)
        if point.attempt <= self.settings.retries:
            job_dir = self.sweep_dir / str(point.number)
            kept = resume.aside(self.sweep_dir, job_dir) if job_dir.exists() else None
            point.attempt += 1
            pending.appendleft(point)
            log.warning("ray: job %d (%s): %s; left %s%s; it runs again on another worker (attempt %d of %d)",
                        point.number, shown(" ".join(point.overrides)), reason, status,
                        f", kept in {kept}" if kept else "", point.attempt, self.settings.retries + 1)
        else:
            results[point.number] = job_return(point, self.sweep_dir, f"{reason}; left {status}")
            log.warning("ray: job %d (%s): %s; left %s (hydra.launcher.retries=%d; python -m sdjax_runner resume %s "
                        "runs it again)", point.number, shown(" ".join(point.overrides)), reason, status,
                        self.settings.retries, self.sweep_dir)

    def stop_on_interrupt(self) -> None:
        """Ctrl-C or SIGTERM: every worker stopped, the points they ran finished KILLED."""
        import ray

        running = [w for w in self.workers if w.point is not None]
        for worker in self.workers:
            try:
                ray.kill(worker.actor)
            except Exception:
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        for worker in running:
            try:
                ray.get(worker.ref, timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # killed: what it left is finished below
                pass
            assert worker.point is not None
            status = finish_lost_point(worker.point, self.sweep_dir, "the sweep was stopped (Ctrl-C or SIGTERM)")
            log.info("ray: job %d stopped with the sweep; left %s", worker.point.number, status)
        self.workers = []


def held_to_loopback() -> None:
    """A cluster on this host listens on 127.0.0.1 alone: Ray's node address is the loopback's only while its
    ENABLE_RAY_CLUSTER constant is off, read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when ray is imported (on Linux
    it is on, and Ray then swaps 127.0.0.1 for the host's external address and binds its GCS, raylet, workers and
    driver to every interface, its runtime-env agent to the external address). Set before the import; where ray was
    imported already (by another library), its constant is set instead; where neither holds, no local cluster
    is started (measured with ray 2.60: every listener then on 127.0.0.1, tests/test_ray_sweeps.py)."""
    import sys

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray" not in sys.modules:
        return
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010 -- a module attribute mypy cannot see
        return
    raise Refused("hydra.launcher.address: null starts a Ray cluster on this host, and this Ray cannot be held to "
                  "127.0.0.1 (its ENABLE_RAY_CLUSTER setting was not found after ray was imported) (allowed: a "
                  "cluster of your own, started with ray start --head --node-ip-address=127.0.0.1, by its address)")


def describe_resources(resources: dict[str, Any]) -> str:
    """``{"CPU": 2.0, "GPU": 1}`` -> ``CPU: 2, GPU: 1`` (Ray's internal node and memory entries left out)."""
    shown = {k: v for k, v in resources.items() if not k.startswith(("node:", "object_store_memory", "accelerator_type"))}
    return ", ".join(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {v}" for k, v in shown.items()) or "nothing"


def launch(launcher: Any, job_overrides: Any, initial_job_idx: int) -> list[Any]:
    """The Hydra launcher's ``launch`` (hydra_plugins/sdjax_runner_launchers): the pool made at the first
    batch, then the batch's points on it."""
    from hydra.core.singleton import Singleton

    config = launcher.config
    sweep_dir = Path(str(config.hydra.sweep.dir))
    if launcher.pool is None:
        current = process.current()
        setup = WorkerSetup(launcher.hydra_context, launcher.task_function, Singleton.get_state(), os.getcwd(),
                            current.command_line, current.show_tracebacks)
        pool = RayPool(launcher.settings, setup, sweep_dir)
        pool.connect()
        launcher.pool = pool
    points = compose_points(launcher.hydra_context, config, job_overrides, initial_job_idx)
    log.info("ray: %d point(s) on %d worker(s) from %s", len(points), launcher.settings.num_workers, socket.gethostname())
    return launcher.pool.run(points)
