"""``python -m sdjax_runner``: the Hydra application, with one-line errors for bad input."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from sdjax_runner import schema
from sdjax_runner.errors import describe

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> dict:
    from sdjax_runner.runner import run

    hydra_cfg = HydraConfig.get()
    return run(cfg, Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task))


def main() -> None:
    schema.register()
    user_wants_traceback = os.environ.get("HYDRA_FULL_ERROR") == "1"
    # Let Hydra pass exceptions up instead of printing them itself; we print bad input as one line.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _app()
    except Exception as exc:
        message = describe(exc)
        if message is None or user_wants_traceback:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
