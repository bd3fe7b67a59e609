"""``hydra/sweeper=resume``: Hydra's basic sweeper, run again over an existing sweep directory, that
launches only the jobs which did not finish there. ``python -m sdjax_runner resume SWEEP_DIR`` builds
the command; what happens to the directory is in :mod:`sdjax_runner.record.resume`.

Hydra finds sweepers only in the ``hydra_plugins`` namespace package, hence this module."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from sdjax_runner.internals import hydra_basic_sweeper

# Hydra's private module (sdjax_runner/internals.py): an ImportError there makes Hydra skip this plugin, with a warning.
BasicSweeper, BasicSweeperConf = hydra_basic_sweeper()


@dataclass
class ResumeSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.sdjax_runner_resume.resume_sweeper.ResumeSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="resume", node=ResumeSweeperConf, provider="sdjax_runner")


class ResumeSweeper(BasicSweeper):
    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from sdjax_runner.record.resume import SkipFinished

        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = SkipFinished(self.launcher, Path(config.hydra.sweep.dir))
