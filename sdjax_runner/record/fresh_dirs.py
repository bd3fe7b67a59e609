"""A run directory holds one run. Given the same ``hydra.run.dir`` (or ``hydra.sweep.dir``) twice,
the second run's images would mix with the first's and its tracker run would log both: such a
command is refused with one line before Hydra writes anything into the directory (its ``.hydra/``
record of the first run included) -- unless the command resumes that sweep (``hydra/sweeper=resume``,
see :mod:`.resume`), which checks and prepares the directory instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sdjax_runner.errors import Refused
from sdjax_runner.record import rundir

# What marks a directory as holding a run (or a sweep): any of these.
RUN_MARKS = (rundir.STATUS, rundir.IMAGES_DIR, rundir.HYDRA_DIR, rundir.TIMINGS)
SWEEP_MARKS = (rundir.SWEEP, rundir.SUMMARY_CSV, "0")


def refuse_reused(directory: Path, marks: tuple[str, ...], key: str) -> None:
    found = [name for name in marks if (directory / name).exists()]
    if found:
        raise Refused(f"{key}: {directory} already holds a run ({', '.join(found)}); a run directory holds "
                      "one run (allowed: a new or empty directory; leave it unset for a fresh one)")


class FreshDirectories(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        dist = config.parallelism.distributed
        if dist.enabled and dist.process_id != 0:  # only process 0 of a multi-host run writes a run there
            return
        # hydra.run.dir may read ${hydra:...}, which Hydra itself makes readable only when the job starts.
        HydraConfig.instance().set_config(config)
        refuse_reused(Path(OmegaConf.select(config, "hydra.run.dir")), RUN_MARKS, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from sdjax_runner.record import resume

        if resume.resuming(config):
            dist = config.parallelism.distributed
            if not dist.enabled or dist.process_id == 0:  # process 0 alone prepares the directory
                resume.prepare(Path(config.hydra.sweep.dir), list(config.hydra.overrides.task))
            return
        refuse_reused(Path(OmegaConf.select(config, "hydra.sweep.dir")), SWEEP_MARKS, "hydra.sweep.dir")
