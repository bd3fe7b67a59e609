"""A run directory holds one run. Given the same ``hydra.run.dir`` (or ``hydra.sweep.dir``) twice,
the second run's images would mix with the first's and its tracker run would log both: such a
command is refused with one line before Hydra writes anything into the directory (its ``.hydra/``
record of the first run included) -- unless the command resumes that sweep (``hydra/sweeper=resume``,
see :mod:`.resume`), which checks and prepares the directory instead.

A directory the user did not name -- the default, time-stamped to the second -- is claimed instead:
two runs of the same name started in the same second (two terminals, a script, a bad value refused
in under a second and the corrected command) get ``..._smoke`` and ``..._smoke_2``, the name taken
atomically (``mkdir``), so concurrent processes never share one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

from sdjax_runner import process
from sdjax_runner.config.overrides import literal
from sdjax_runner.config.start_checks import given
from sdjax_runner.console import one_line
from sdjax_runner.errors import Refused
from sdjax_runner.record import rundir

# What marks a directory as holding a run (or a sweep): any of these.
RUN_MARKS = (rundir.STATUS, rundir.IMAGES_DIR, rundir.HYDRA_DIR, rundir.TIMINGS)
SWEEP_MARKS = (rundir.SWEEP, rundir.SUMMARY_CSV, "0")


# What the other processes of one multi-host run leave in the run directory they share with process 0 (a
# SLURM job's hydra.run.dir on a shared filesystem): Hydra's record and log of each. Process 0's check of the
# directory does not take them for another run's, whichever process arrives first.
PEER_FILES = (rundir.HYDRA_DIR, "run.log")


def refuse_reused(directory: Path, marks: tuple[str, ...], key: str, peers: tuple[str, ...] = ()) -> None:
    """A directory the user named must be new or empty: one holding a run (``marks``) or anything else
    (``hydra.run.dir=/etc``) is refused; ``peers``: names the other processes of this very run may have written."""
    marks = tuple(name for name in marks if name not in peers)
    found = [name for name in marks if (directory / name).exists()]
    if found:
        raise Refused(f"{key}: {directory} already holds a run ({', '.join(found)}); a run directory holds "
                      "one run (allowed: a new or empty directory; leave it unset for a fresh one)")
    try:
        held = sorted(p.name for p in directory.iterdir() if p.name not in peers)[:3] if directory.is_dir() else []
    except OSError as exc:
        raise Refused(f"{key}: {directory} cannot be read ({exc.strerror}) (allowed: a new or empty directory "
                      "you may write to)") from None
    if held:
        raise Refused(f"{key}: {directory} is not empty (it holds {', '.join(held)}{', ...' if len(held) == 3 else ''}) "
                      "(allowed: a new or empty directory; leave it unset for a fresh one)")


def claim(directory: Path) -> Path:
    """``directory``, or ``directory_2``, ``_3``, ...: the first that this process creates itself."""
    candidate, number = directory.absolute(), 1  # (a relative paths.output_root is released by its absolute path)
    new_parents = [p for p in candidate.parents if not p.exists()]
    while True:
        try:
            candidate.mkdir(parents=True)
            process.current().claimed_dirs[candidate] = new_parents  # a command refused later gives them back
            return candidate
        except FileExistsError:
            number += 1
            candidate = candidate.with_name(f"{directory.name}_{number}")


def release(directory: Path) -> None:
    """A claimed directory left empty by a command refused after the claim: removed again."""
    claimed = process.current().claimed_dirs
    directory = directory.absolute()
    if directory not in claimed:
        return
    for path in [directory, *claimed.pop(directory)]:  # nearest first
        try:
            path.rmdir()  # only if empty
        except OSError:
            return


# What a run refused before it started leaves in its directory: Hydra's record and log, our status.json.
REFUSAL_LEAVES = (rundir.HYDRA_DIR, "run.log", rundir.STATUS)


def remove_refused(directory: Path) -> bool:
    """A single run refused for bad input before it started (no model loaded, no tracker run): what the
    refusal left in ``directory`` removed, and the directory too where this process made it -- so a
    refused command leaves no run behind, whichever check refused it (Hydra's while composing, ours
    after). A directory holding anything else is left as it is. Whether it was removed."""
    import shutil

    if not directory.is_dir() or any(p.name not in REFUSAL_LEAVES for p in directory.iterdir()):
        return False
    for name in REFUSAL_LEAVES:
        path = directory / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    release(directory)
    return True


def fresh(config: DictConfig, key: str, marks: tuple[str, ...], peers: tuple[str, ...] = ()) -> None:
    """Refuse a used directory the user named; claim a fresh one where the default was taken."""
    directory = Path(OmegaConf.select(config, key))  # one that cannot be made: refused by StartChecks, called first
    if given(config, key):
        refuse_reused(directory, marks, key, peers)
        if not directory.exists():  # Hydra makes it: a refusal before the run starts may give it back
            process.current().claimed_dirs[directory.absolute()] = [
                p for p in directory.absolute().parents if not p.exists()]
        return
    claimed = claim(directory)
    if claimed != directory.absolute():  # as if given on the command line: a sweep's jobs compose their dirs from it
        claimed = directory.with_name(claimed.name)  # (relative where the default was)
        with read_write(config.hydra):  # HydraConfig.set_config made the node read-only
            OmegaConf.update(config, key, str(claimed))
            config.hydra.overrides.hydra.append(f"{key}={literal(str(claimed))}")


class FreshDirectories(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        dist = config.parallelism.distributed
        if dist.enabled and dist.process_id != 0:  # only process 0 of a multi-host run writes a run there
            return
        # hydra.run.dir may read ${hydra:...}, which Hydra itself makes readable only when the job starts.
        HydraConfig.instance().set_config(config)
        fresh(config, "hydra.run.dir", RUN_MARKS, PEER_FILES if dist.enabled else ())

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from sdjax_runner.record import resume

        if resume.resuming(config):
            dist = config.parallelism.distributed
            if not dist.enabled or dist.process_id == 0:  # process 0 alone prepares the directory
                sweep_dir = Path(config.hydra.sweep.dir)
                try:
                    resume.prepare(sweep_dir, list(config.hydra.overrides.task))
                except Exception as exc:  # Hydra would make it a warning and launch into an unprepared directory
                    raise Refused(f"hydra.sweep.dir: {sweep_dir} cannot be resumed: {type(exc).__name__}: "
                                  f"{one_line(exc, 300)}") from None
            return
        fresh(config, "hydra.sweep.dir", SWEEP_MARKS)
