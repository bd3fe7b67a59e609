"""``python -m sdjax_runner resume SWEEP_DIR``: finish a sweep that was cut short (a preempted VM, a
killed process, Ctrl-C), running only the jobs that did not finish, into the same sweep directory and
the same MLflow parent run.

It repeats the sweep's recorded command -- its overrides, Hydra overrides (a launcher, say),
``--config-dir``, ``--config-name`` and working directory, from ``SWEEP_DIR/multirun.yaml`` -- with
``hydra.sweep.dir=SWEEP_DIR hydra/sweeper=resume``; what that does is in
:mod:`sdjax_runner.record.resume`. Exit codes are the sweep's: 0, 1 if a job failed, 2 for bad input.

    python -m sdjax_runner resume outputs/multiruns/2026-11-23/05-30-12_smoke
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import yaml

from sdjax_runner.config.naming import quoted
from sdjax_runner.record import rundir

# Hydra overrides the resumed command sets itself.
OWN = ("hydra.mode=", "hydra.sweep.dir=", "hydra/sweeper=")


def recorded_command(sweep_dir: Path) -> tuple[list[str], Optional[str]]:
    """(argv after ``python -m sdjax_runner``, the working directory) of the sweep."""
    path = sweep_dir / rundir.MULTIRUN
    try:
        with open(path, encoding="utf-8") as file:
            hydra = yaml.safe_load(file)["hydra"]
        task, hydra_overrides = list(hydra["overrides"]["task"]), list(hydra["overrides"]["hydra"])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ValueError(f"SWEEP_DIR: {sweep_dir} has no readable {rundir.MULTIRUN} ({type(exc).__name__}): not "
                         "the directory of a multirun (allowed: outputs/multiruns/DATE/TIME_NAME)") from None
    other = [o for o in hydra_overrides if o.startswith("hydra/sweeper=") and o != "hydra/sweeper=resume"]
    if other:
        raise ValueError(f"hydra/sweeper: {other[0].split('=', 1)[1]} sweeps cannot be resumed (allowed: basic)")
    kept = [o for o in hydra_overrides if not o.startswith(OWN)]
    config_dir = next((s.get("path") for s in hydra.get("runtime", {}).get("config_sources", [])
                       if s.get("provider") == "command-line" and s.get("schema") == "file"), None)
    config_name = hydra.get("job", {}).get("config_name")
    argv = (["--config-dir", config_dir] if config_dir else []) + (
        ["--config-name", config_name] if config_name and config_name != "config" else []) + ["-m", *task, *kept,
                                                                   f"hydra.sweep.dir={quoted(str(sweep_dir.resolve()))}",
                                                                   "hydra/sweeper=resume"]
    return argv, hydra.get("runtime", {}).get("cwd")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sdjax_runner resume", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="the directory of the sweep (outputs/multiruns/DATE/TIME_NAME)")
    args = parser.parse_args(argv)
    try:
        command, cwd = recorded_command(args.sweep_dir.expanduser())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if cwd and Path(cwd).is_dir() and Path(cwd).resolve() != Path.cwd().resolve():
        print(f"resume: in {cwd}, where the sweep was started (its relative paths are from there)")
        os.chdir(cwd)
    print("resume: python -m sdjax_runner " + shlex.join(command))
    from sdjax_runner.commands.run import entry

    sys.argv = [sys.argv[0], *command]
    entry()

