"""The commands, on top of the library: ``python -m sdjax_runner`` (or ``sdjax-runner``) and its six others.

    python -m sdjax_runner +experiment=NAME [KEY=VALUE ...]   a run, or with -m a sweep (run.py)
    python -m sdjax_runner runs list | diff A B                look at runs without MLflow (runs.py)
    python -m sdjax_runner rerun RUN                           run a recorded run again (rerun.py)
    python -m sdjax_runner sync RUN                            log a run the tracker missed (sync.py)
    python -m sdjax_runner resume SWEEP_DIR                    finish a sweep cut short (resume.py)
    python -m sdjax_runner from_png IMAGE.png [KEY=VALUE ...]  make an image again from its A1111 infotext (from_png.py)
    python -m sdjax_runner report SWEEP [report.x=KEY ...]     (re)build a sweep's report.html (report.py)

A first argument that names a command picks it (no Hydra override is a bare word); anything else
is the run's Hydra command line.
"""

from __future__ import annotations

import sys
from typing import NoReturn

COMMANDS = ("runs", "rerun", "sync", "resume", "from_png", "report")


def entry() -> NoReturn:
    argv = sys.argv[1:]
    if argv and argv[0] in COMMANDS:
        import importlib

        command = importlib.import_module(f"{__name__}.{argv[0]}")
        sys.exit(command.main(argv[1:]))
    from sdjax_runner.commands.run import entry as run

    run()
