"""The settings of this package's sweep launchers (``hydra/launcher=ray``, ``slurm_workers``,
``local_workers``: sdjax_runner/launchers/), read and checked once, before the sweep writes anything
(record/sweep.py's start calls :func:`check_launcher`): a bad value is one line naming its key, and a Ray
address that does not answer is one line within ``hydra.launcher.connect_timeout_s``.

The launchers' configs themselves are dataclasses in hydra_plugins/sdjax_runner_launchers (Hydra's config
store); each key is documented there and in docs/guides/clusters.md.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from sdjax_runner.errors import UserError

RAY_TARGET = "hydra_plugins.sdjax_runner_launchers.launchers.RayLauncher"
ARRAY_TARGETS = ("hydra_plugins.sdjax_runner_launchers.launchers.SlurmWorkersLauncher",
                 "hydra_plugins.sdjax_runner_launchers.launchers.LocalWorkersLauncher")
DEFAULT_RAY_PORT = 6379
_ADDRESS = re.compile(r"(ray://)?(\[[0-9a-fA-F:.]+\]|[\w.-]+)(:(\d{1,5}))?")


@dataclass(frozen=True)
class RayLauncherSettings:
    num_workers: int = 2
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1})
    address: Optional[str] = None
    connect_timeout_s: float = 30.0
    start_timeout_s: float = 300.0
    retries: int = 1
    env: dict[str, str] = field(default_factory=dict)


def _positive_int(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(key, f"must be a whole number >= {minimum}, got {value!r}", f"{minimum}, {minimum + 1}, ...")
    return value


def _positive_seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise UserError(key, f"must be a number of seconds, got {value!r}", "a number > 0 and <= 86400")
    return float(value)


def ray_settings(launcher: DictConfig) -> RayLauncherSettings:
    """``hydra.launcher`` of ``hydra/launcher=ray``, typed and checked (:class:`UserError` naming the key)."""
    key = "hydra.launcher"
    given = launcher.get("resources")
    resources = OmegaConf.to_container(given) if OmegaConf.is_config(given) else {"CPU": 1} if given is None else given
    if not isinstance(resources, dict) or not resources or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e6
            for k, v in resources.items()):
        raise UserError(f"{key}.resources", f"must name what one worker takes, got {str(resources)[:200]}",
                        "{CPU: 1}, {GPU: 1}, {TPU: 4}, {CPU: 4, GPU: 1}: resource names and positive amounts "
                        "below a million")
    env = OmegaConf.to_container(launcher.env) if launcher.get("env") is not None else {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
                                            and isinstance(v, (str, int, float)) for k, v in env.items()):
        raise UserError(f"{key}.env", f"must map variable names to values, got {env!r}",
                        "{XLA_FLAGS: --xla_force_host_platform_device_count=4, JAX_PLATFORMS: cpu}")
    address = launcher.get("address")
    if address is not None and (not isinstance(address, str) or not (address == "auto" or _ADDRESS.fullmatch(address))):
        raise UserError(f"{key}.address", f"is not a Ray cluster address: {str(address)[:200]!r}",
                        "host:port of a head node (10.0.0.5:6379), ray://host:10001, auto, or null (RAY_ADDRESS, "
                        "else a local cluster)")
    return RayLauncherSettings(
        num_workers=_positive_int(f"{key}.num_workers", launcher.get("num_workers")),
        resources={str(k): float(v) for k, v in resources.items()}, address=address,
        connect_timeout_s=_positive_seconds(f"{key}.connect_timeout_s", launcher.get("connect_timeout_s")),
        start_timeout_s=_positive_seconds(f"{key}.start_timeout_s", launcher.get("start_timeout_s")),
        retries=_positive_int(f"{key}.retries", launcher.get("retries"), minimum=0),
        env={str(k): str(v) for k, v in env.items()})


def cluster_address(address: Optional[str]) -> Optional[str]:
    """The address to connect to: the setting, else ``RAY_ADDRESS``; None: start a local cluster."""
    return address or os.environ.get("RAY_ADDRESS") or None


def host_port(address: str) -> tuple[str, int]:
    found = _ADDRESS.fullmatch(address)
    if found is None:
        raise UserError("hydra.launcher.address", f"is not a Ray cluster address: {address[:200]!r}",
                        "host:port, ray://host:port or auto")
    port = int(found.group(4)) if found.group(4) else (10001 if found.group(1) else DEFAULT_RAY_PORT)
    return found.group(2).strip("[]"), port


def is_loopback(address: str) -> bool:
    """Whether ``address`` names this host's loopback (127.0.0.1, localhost, ::1)."""
    if address == "auto":
        return False
    host = host_port(address)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_answers(address: str, timeout_s: float) -> None:
    """One TCP connection to the head's port within ``timeout_s`` (Ray's own client waits minutes on an
    address that does not answer): :class:`UserError` naming the address otherwise."""
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        why = "did not answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
    raise UserError("hydra.launcher.address", f"the Ray cluster at {address} cannot be reached: {why} "
                    f"(waited up to {timeout_s:g} s)", "the address of a running head node (ray start --head prints "
                    "it; RAY_ADDRESS), or null to start a local cluster")


def check_launcher(config: DictConfig, points: Optional[int]) -> None:
    """This package's launcher settings checked before a sweep of ``points`` jobs starts (nothing for other
    launchers): no more workers than points (None: a sweeper that samples them), a SLURM sweep where SLURM is, a
    Ray address that answers."""
    target = OmegaConf.select(config, "hydra.launcher._target_")
    if target == RAY_TARGET:
        settings = ray_settings(config.hydra.launcher)
        _at_most_points(settings.num_workers, points)
        address = cluster_address(settings.address)
        if address is not None and address != "auto":
            check_answers(address, settings.connect_timeout_s)
    elif target in ARRAY_TARGETS:
        _at_most_points(_positive_int("hydra.launcher.num_workers", config.hydra.launcher.get("num_workers")), points)
        if target == ARRAY_TARGETS[0] and shutil.which("sbatch") is None:
            raise UserError("hydra/launcher", "slurm_workers submits its array tasks with SLURM's sbatch (and runs "
                            "them with srun), which this machine's PATH does not have", "slurm_workers on a SLURM "
                            "login node, or hydra/launcher=local_workers to run the same workers on this host")


def _at_most_points(workers: int, points: Optional[int]) -> None:
    if points is not None and workers > points:  # each worker loads the model and compiles before it takes a point: idle ones cost that
        raise UserError("hydra.launcher.num_workers", f"{workers} workers for a sweep of {points} point(s)",
                        f"1..{points}")


def check_capacity(settings: RayLauncherSettings, points: int, have: dict[str, float], local: bool) -> Optional[str]:
    """What ``num_workers`` workers of ``resources`` each need that the cluster (``have``: Ray's
    cluster_resources) does not hold: a line for :class:`UserError`, or None. On a cluster this command started
    nothing is added later, so that is refused at once, not after ``start_timeout_s``; on a running cluster an
    autoscaler may add nodes (the caller says so and waits)."""
    workers = min(settings.num_workers, points)
    short = {name: (workers * amount, have.get(name, 0.0)) for name, amount in settings.resources.items()
             if workers * amount > have.get(name, 0.0) + 1e-9}
    if not short:
        return None
    needs = ", ".join(f"{name} {need:g} (it has {held:g})" for name, (need, held) in short.items())
    where = "this host's local cluster" if local else "the cluster, as it is now"
    return f"{workers} worker(s) of {describe(settings.resources)} need {needs} from {where}"


def describe(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in sorted(resources.items())) + "}"
