"""``python -m sdjax_runner``: the Hydra application, with one-line errors for bad input.

Bad input -- a config Hydra cannot compose, or a value the plan rejects -- is
printed as ``error: <key>: <problem> (allowed: ...)`` with exit code 2 and no
traceback. ``HYDRA_FULL_ERROR=1`` brings the traceback back. Anything else
(a bug, an out-of-memory) keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sdjax_runner import schema
from sdjax_runner.errors import describe

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")
BAD_INPUT_EXIT = 2
_show_tracebacks = False


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(BAD_INPUT_EXIT)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> dict:
    from sdjax_runner.runner import run

    hydra_cfg = HydraConfig.get()
    try:
        return run(cfg, Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task))
    except Exception as exc:
        message = describe(exc)
        # In a multirun the sweep goes on and Hydra reports the failed job at the end.
        if message is None or _show_tracebacks or hydra_cfg.mode == RunMode.MULTIRUN:
            raise
        _fail(message)
        raise  # unreachable: _fail exits


def main() -> None:
    global _show_tracebacks
    schema.register()
    _show_tracebacks = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Let Hydra pass its composition errors up instead of printing them itself.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _app()
    except Exception as exc:
        message = describe(exc)
        if message is None or _show_tracebacks:
            raise
        _fail(message)
