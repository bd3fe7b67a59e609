"""``hydra/launcher=ray``, ``slurm_workers`` and ``local_workers``: sweeps whose workers each load and compile
once (sdjax_runner/launchers/, docs/guides/clusters.md). The Hydra side only: the configs, documented here, and
launchers that hand their points to sdjax_runner.launchers. Each is registered only where its library is
installed (``pip install 'sdjax-runner[ray]'`` / ``'sdjax-runner[slurm]'``); without it, choosing it is one
line naming the extra.

Hydra finds launchers only in the ``hydra_plugins`` namespace package, hence this module."""

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

TARGETS = "hydra_plugins.sdjax_runner_launchers.launchers"


@dataclass
class RayLauncherConf:
    _target_: str = f"{TARGETS}.RayLauncher"
    # Workers: long-lived processes (Ray actors), each loading each model and compiling each program once.
    num_workers: int = 2
    # What one worker takes from the cluster: {GPU: 1} (one GPU each; Ray sets CUDA_VISIBLE_DEVICES), {TPU: 4} (a
    # TPU VM host's chips), {CPU: 4, GPU: 1}, or a custom resource a node was started with; null: {CPU: 1}. A worker
    # takes 1 CPU unless CPU is given.
    resources: Any = None
    # A running cluster's head (host:port from `ray start --head`, ray://host:10001, auto); null: RAY_ADDRESS if
    # set, else a local cluster on this host (loopback only, no dashboard), stopped when the command ends.
    address: Optional[str] = None
    # How long the head's port may take to answer before the sweep is refused (nothing written by then).
    connect_timeout_s: float = 30.0
    # How long the cluster may take to start the workers (a GPU that is not there: refused after this).
    start_timeout_s: float = 300.0
    # A point whose worker died runs again on another worker this many times (0: it is left KILLED).
    retries: int = 1
    # Environment variables of the workers (e.g. XLA_FLAGS=--xla_force_host_platform_device_count=4).
    env: dict[str, str] = field(default_factory=dict)


class RayLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: Any = None
        self.hydra_context: Any = None
        self.task_function: Any = None
        self.settings: Any = None
        self.pool: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from sdjax_runner.config.launchers import ray_settings

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.settings = ray_settings(config.hydra.launcher)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from sdjax_runner.launchers.ray_sweep import launch

        return launch(self, job_overrides, initial_job_idx)


if importlib.util.find_spec("ray") is not None:
    ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf, provider="sdjax_runner")


if importlib.util.find_spec("submitit") is not None and \
        importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

    @dataclass
    class SlurmWorkersConf(SlurmQueueConf):
        """hydra-submitit-launcher's ``submitit_slurm`` settings (partition, gpus_per_node, timeout_min, ...),
        one array task per worker."""

        _target_: str = f"{TARGETS}.SlurmWorkersLauncher"
        # Array tasks: the points are split into this many shares, each run by one process.
        num_workers: int = 2

    @dataclass
    class LocalWorkersConf(LocalQueueConf):
        """The same on this host: submitit's local executor runs each array task as a local process."""

        _target_: str = f"{TARGETS}.LocalWorkersLauncher"
        num_workers: int = 2

    class _WorkersLauncher(BaseSubmititLauncher):
        def __init__(self, **params: Any) -> None:
            self.num_workers = params.pop("num_workers")
            super().__init__(**params)

        def executor(self) -> Any:
            """A submitit executor with the launcher's parameters, as hydra-submitit-launcher makes it."""
            import submitit
            from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
            from omegaconf import OmegaConf

            init_keys = {"submitit_folder", "max_num_timeout"}
            executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
                                             **({f"{self._EXECUTOR}_max_num_timeout": self.params["max_num_timeout"]}
                                                if "max_num_timeout" in self.params else {}))
            base = set(OmegaConf.structured(BaseQueueConf).keys())
            executor.update_parameters(**{key if key in base else f"{self._EXECUTOR}_{key}": value
                                          for key, value in self.params.items() if key not in init_keys})
            return executor

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
            from sdjax_runner.launchers.array_tasks import launch

            return launch(self, self.executor(), job_overrides, initial_job_idx)

    class SlurmWorkersLauncher(_WorkersLauncher):
        _EXECUTOR = "slurm"

    class LocalWorkersLauncher(_WorkersLauncher):
        _EXECUTOR = "local"

    ConfigStore.instance().store(group="hydra/launcher", name="slurm_workers", node=SlurmWorkersConf,
                                 provider="sdjax_runner")
    ConfigStore.instance().store(group="hydra/launcher", name="local_workers", node=LocalWorkersConf,
                                 provider="sdjax_runner")
