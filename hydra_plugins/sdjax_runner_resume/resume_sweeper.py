"""The runner's sweepers, both Hydra's basic sweeper (the points of the command line, in order):

- ``hydra/sweeper=checked``, the default (conf/config.yaml): the basic sweeper, minus its composing of every
  point before any is launched. The runner has checked the points by then, one key at a time
  (sdjax_runner/config/sweep_points.py, run as the sweep starts), and the launcher composes each point as it
  runs it, so the basic sweeper's pass composed each point a second time: a 1,000-seed sweep spent 1,000
  compositions (~0.15 s each) before its first image.
- ``hydra/sweeper=resume``: the checked sweeper run again over an existing sweep directory, launching only the
  jobs which did not finish there. ``python -m sdjax_runner resume SWEEP_DIR`` builds the command; what happens
  to the directory is in :mod:`sdjax_runner.record.resume`.

Hydra finds sweepers only in the ``hydra_plugins`` namespace package, hence this module."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from sdjax_runner.internals import hydra_basic_sweeper

# Hydra's private module (sdjax_runner/internals.py): an ImportError there makes Hydra skip this plugin, with a warning.
BasicSweeper, BasicSweeperConf = hydra_basic_sweeper()


@dataclass
class CheckedSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.sdjax_runner_resume.resume_sweeper.CheckedSweeper"


@dataclass
class ResumeSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.sdjax_runner_resume.resume_sweeper.ResumeSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="checked", node=CheckedSweeperConf, provider="sdjax_runner")
ConfigStore.instance().store(group="hydra/sweeper", name="resume", node=ResumeSweeperConf, provider="sdjax_runner")


class CheckedSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Any) -> None:
        """Nothing: the points were checked as the sweep started (config/sweep_points.check_points), and each is
        composed when it is launched; a point that composes only beside another's value fails there, by name."""


class ResumeSweeper(CheckedSweeper):
    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from sdjax_runner.record.resume import SkipFinished

        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = SkipFinished(self.launcher, Path(config.hydra.sweep.dir))
