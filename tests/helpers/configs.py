"""Composing the package's configs with Hydra's compose API, as the CLI composes them."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_module

import sdjax_runner
from sdjax_runner.commands.run import CONFIG_MODULE
from sdjax_runner.config import schema

CONF = Path(sdjax_runner.__file__).resolve().parent / "conf"


def options(group: str) -> list[str]:
    """The option names of a config group (its YAML files)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(overrides):
    schema.register()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)
