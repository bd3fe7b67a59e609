"""The commands, on top of the library: ``python -m sdjax_runner`` (or ``sdjax-runner``) and its seven others.

    python -m sdjax_runner +experiment=NAME [KEY=VALUE ...]   a run, or with -m a sweep (run.py)
    python -m sdjax_runner runs list | diff A B                look at runs without MLflow (runs.py)
    python -m sdjax_runner rerun RUN                           run a recorded run again (rerun.py)
    python -m sdjax_runner sync RUN                            log a run the tracker missed (sync.py)
    python -m sdjax_runner resume SWEEP_DIR                    finish a sweep cut short (resume.py)
    python -m sdjax_runner from_png IMAGE.png [KEY=VALUE ...]  make an image again from its A1111 infotext (from_png.py)
    python -m sdjax_runner report SWEEP [report.x=KEY ...]     (re)build a sweep's report.html (report.py)
    python -m sdjax_runner evaluate A B [--clip MODEL_FOLDER]  CMMD between two image sets, paired metrics (evaluate.py)

A first argument that names a command picks it; any other bare word (no Hydra override is one: they hold
``=`` or start with ``+``, ``~`` or ``-``) is an unknown command, one line; anything else is the run's Hydra
command line.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

COMMANDS = ("runs", "rerun", "sync", "resume", "from_png", "report", "evaluate")
COMMANDS_PAGE = "docs/reference/commands.md"


def command_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m sdjax_runner NAME``: its --help is the module docstring's first paragraph
    (the usage line and what the command does) and where its docs page is."""
    summary = doc.strip().split("\n\n")[0]
    return argparse.ArgumentParser(
        prog=f"python -m sdjax_runner {name}", description=summary,
        epilog=f"Docs: {COMMANDS_PAGE}#{name} (in the repository; or the site: "
               'pip install -e ".[docs]" && mkdocs serve)',
        formatter_class=argparse.RawDescriptionHelpFormatter)


# What every command imports: a Python without them (the system's, the venv not activated) gets one line.
REQUIRED = ("hydra", "omegaconf", "jax", "flax", "mlflow", "PIL", "numpy")


def missing_dependency() -> str | None:
    """One line for a Python that lacks the project's libraries (or is older than 3.12), else None."""
    import importlib.util

    if sys.version_info < (3, 12):  # noqa: UP036 -- this check is what an older Python runs into first
        found = f"Python {sys.version.split()[0]}"
    else:
        absent = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
        if not absent:
            return None
        found = f"no {', '.join(absent)}"
    return (f"error: this Python ({sys.executable}) cannot run sdjax-runner ({found}): activate the project's "
            "virtual environment (source .venv/bin/activate) or install it there: python3.12 -m venv .venv && "
            ".venv/bin/pip install -e .")


def unknown_command(word: str) -> str | None:
    """The one line for a first argument that is a bare word but no command (``run``, ``help``), or None."""
    if re.fullmatch(r"[A-Za-z_][\w-]*", word) and word not in COMMANDS:
        return (f"unknown command {word!r} (allowed: {', '.join(COMMANDS)}; a run is "
                "python -m sdjax_runner +experiment=NAME [KEY=VALUE ...], see python -m sdjax_runner --help)")
    return None


def entry() -> NoReturn:
    argv = sys.argv[1:]
    unknown = unknown_command(argv[0]) if argv else None
    if unknown:
        from sdjax_runner.console import error

        error(unknown)
        sys.exit(2)
    if argv and argv[0] in COMMANDS:
        import importlib

        command = importlib.import_module(f"{__name__}.{argv[0]}")
        sys.exit(command.main(argv[1:]))
    from sdjax_runner.commands.run import entry as run

    run()
