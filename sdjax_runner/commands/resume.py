"""``python -m sdjax_runner resume SWEEP_DIR``: finish a sweep that was cut short (a preempted VM, a
killed process, Ctrl-C), running only the jobs that did not finish, into the same sweep directory and
the same MLflow parent run.

It repeats the sweep's recorded command -- its overrides, Hydra overrides (a launcher, say),
``--config-dir``, ``--config-name`` and working directory, from ``SWEEP_DIR/multirun.yaml`` -- with
``hydra.sweep.dir=SWEEP_DIR hydra/sweeper=resume``; what that does is in
:mod:`sdjax_runner.record.resume`. Exit codes are the sweep's: 0, 1 if a job failed, 2 for bad input.

A launcher's settings are replayed only where they cannot start a program, change a process's environment or
send the work elsewhere (config/overrides.REPLAYED_LAUNCHER_KEYS: worker counts, resources, partitions, timeouts);
the rest -- Ray's env and address, submitit's setup lines and additional parameters -- are dropped, in one line
naming them, and given again on the command line if wanted. A sweep folder holding a link among the files a
resume writes is refused: Hydra and the runner would write through it.

    python -m sdjax_runner resume outputs/multiruns/2026-11-23/05-30-12_smoke
    python -m sdjax_runner resume SWEEP_DIR hydra/launcher=ray hydra.launcher.num_workers=4 \
        '+hydra.launcher.env.XLA_FLAGS=--xla_force_host_platform_device_count=4'
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.config.overrides import LAUNCHER, launcher_key, launcher_settings_replayed, literal, replayable
from sdjax_runner.config.schema import RunConfig, field_types
from sdjax_runner.errors import UserError
from sdjax_runner.files import UnreadableRecord, read_yaml
from sdjax_runner.record import rundir

# Hydra overrides the resumed command sets itself.
OWN = ("hydra.mode=", "hydra.sweep.dir=", "hydra/sweeper=")


def recorded_command(sweep_dir: Path, given: Sequence[str] = ()) -> tuple[list[str], Optional[str], list[str]]:
    """(argv after ``python -m sdjax_runner``, the working directory, the launcher settings not replayed) of the
    sweep: only what the runner itself records and replays (config/overrides.replayable), refused in one line
    (ValueError) otherwise; ``given``: launcher overrides from the command line, replacing the recorded ones."""
    linked = links_written_through(sweep_dir)
    if linked:
        raise ValueError(f"SWEEP_DIR: {linked} is a link, and a resume writes there (allowed: a sweep folder whose "
                         "records are files, as the runner writes them)")
    path = sweep_dir / rundir.MULTIRUN
    try:
        hydra = read_yaml(path)["hydra"]
        task, hydra_overrides = list(hydra["overrides"]["task"]), list(hydra["overrides"]["hydra"])
    except UnreadableRecord as exc:
        raise ValueError(f"SWEEP_DIR: {path} {exc}") from None
    except (OSError, KeyError, TypeError) as exc:
        raise ValueError(f"SWEEP_DIR: {sweep_dir} has no readable {rundir.MULTIRUN} ({type(exc).__name__}): not "
                         "the directory of a multirun (allowed: outputs/multiruns/DATE/TIME_NAME)") from None
    try:
        task = replayable(task, str(path), field_types(RunConfig))
        hydra_overrides = replayable(hydra_overrides, str(path), ())
    except UserError as error:
        raise ValueError(str(error)) from None
    other = [o for o in hydra_overrides if o.startswith("hydra/sweeper=") and o != "hydra/sweeper=resume"]
    if other:
        raise ValueError(f"hydra/sweeper: {other[0].split('=', 1)[1]} sweeps cannot be resumed (allowed: basic)")
    hydra_overrides, dropped = launcher_settings_replayed(hydra_overrides)
    kept = with_given(hydra_overrides, list(given))
    runtime = hydra.get("runtime") or {}
    config_dir = recorded_config_dir(runtime, sweep_dir)
    config_name = (hydra.get("job") or {}).get("config_name")
    if config_name is not None and (not isinstance(config_name, str) or not re.fullmatch(r"[\w.-]+", config_name)):
        raise ValueError(f"SWEEP_DIR: {path} names the config {str(config_name)[:80]!r} (allowed: a config file's name)")
    argv = (["--config-dir", config_dir] if config_dir else []) + (
        ["--config-name", config_name] if config_name and config_name != "config" else []) + ["-m", *task, *kept,
                                                                   f"hydra.sweep.dir={literal(str(sweep_dir.resolve()))}",
                                                                   "hydra/sweeper=resume"]
    cwd = runtime.get("cwd")
    return argv, cwd if isinstance(cwd, str) else None, dropped


def with_given(recorded: list[str], given: list[str]) -> list[str]:
    """The recorded Hydra overrides (less those the resume sets itself) with the command line's launcher
    overrides: a launcher named there replaces the recorded one and its settings; a setting, the same one."""
    for override in given:
        if not (override.startswith("hydra/launcher=") or launcher_key(override)):
            raise ValueError(f"OVERRIDES: {override[:200]!r} is not a launcher setting; a resumed sweep keeps its "
                             f"points (allowed: hydra/launcher=NAME, {LAUNCHER}KEY=VALUE, +{LAUNCHER}KEY=VALUE)")
    if any(o.startswith("hydra/launcher=") for o in given):
        recorded = [o for o in recorded if not (o.startswith("hydra/launcher=") or launcher_key(o))]
    keys = {o.partition("=")[0].lstrip("+~") for o in given}
    return [o for o in recorded if not o.startswith(OWN) and o.partition("=")[0].lstrip("+~") not in keys] + given


# What a resume writes in a sweep folder (Hydra's records and the runner's), where a link would be written through.
WRITTEN_TOP = ("multirun.yaml", "sweep.json", "summary.csv", "summary.json", "comparison.json", "contact_sheet.png",
               "report.png", "report.html")


def links_written_through(sweep_dir: Path) -> Optional[Path]:
    """The first link among the files a resume writes in ``sweep_dir`` -- its records, each job folder and what
    is in it, .hydra/ -- or None. Bounded: a job folder's images/ are written through files.replaced."""
    if not sweep_dir.is_dir() or sweep_dir.is_symlink():
        return sweep_dir if sweep_dir.is_symlink() else None
    for name in WRITTEN_TOP:
        if (sweep_dir / name).is_symlink():
            return sweep_dir / name
    for job in sweep_dir.iterdir():
        if not (job.name.isascii() and job.name.isdigit()):
            continue
        if job.is_symlink():
            return job
        for entry in [*job.iterdir(), *((job / ".hydra").iterdir() if (job / ".hydra").is_dir() else ())]:
            if entry.is_symlink():
                return entry
    return None


def recorded_config_dir(runtime: dict, sweep_dir: Path) -> Optional[str]:
    """The ``--config-dir`` the sweep was started with, if any. Configs inside the sweep directory itself are
    refused: a folder someone hands you must not bring the configs (and so the Hydra callbacks) it runs."""
    config_dir = next((s.get("path") for s in runtime.get("config_sources") or [] if isinstance(s, dict)
                       and s.get("provider") == "command-line" and s.get("schema") == "file"), None)
    if config_dir is None:
        return None
    if not isinstance(config_dir, str) or not Path(config_dir).is_dir():
        raise ValueError(f"--config-dir: {str(config_dir)[:200]}, recorded in {sweep_dir / rundir.MULTIRUN}, is not "
                         "a folder here (allowed: resume where the sweep's configs are)")
    if Path(config_dir).resolve().is_relative_to(sweep_dir.resolve()):
        raise ValueError(f"--config-dir: {config_dir} is inside the sweep directory {sweep_dir}: a sweep directory "
                         "does not bring its own configs (allowed: a config folder outside it)")
    return config_dir


def main(argv: Optional[list[str]] = None) -> None:
    parser = command_parser("resume", __doc__)
    parser.add_argument("sweep_dir", type=Path, help="the directory of the sweep (outputs/multiruns/DATE/TIME_NAME)")
    parser.add_argument("overrides", nargs="*", metavar="LAUNCHER_OVERRIDE",
                        help="hydra/launcher=NAME or hydra.launcher.KEY=VALUE, in place of the recorded ones")
    args = parser.parse_args(argv)
    try:
        command, cwd, dropped = recorded_command(args.sweep_dir.expanduser(), args.overrides)
    except ValueError as error:
        console.error(error)
        sys.exit(2)
    if dropped:
        console.say(console.one_line(f"resume: not replayed from {args.sweep_dir / rundir.MULTIRUN}: "
                                     f"{', '.join(dropped)}", limit=2000) + " (launcher "
                    "settings that can start a program, change a process's environment or send the work elsewhere "
                    "are taken from the command line: resume SWEEP_DIR hydra.launcher.KEY=VALUE)")
    if cwd and Path(cwd).is_dir() and Path(cwd).resolve() != Path.cwd().resolve():
        console.say(f"resume: in {cwd}, where the sweep was started (its relative paths are from there)")
        os.chdir(cwd)
    console.say("resume: python -m sdjax_runner " + shlex.join(command))
    from sdjax_runner.commands.run import entry

    sys.argv = [sys.argv[0], *command]
    entry()

