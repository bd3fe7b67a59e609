"""Your own ``conf/``: the folder ``conf`` in the working directory, searched before the packaged configs
(hydra_plugins/sdjax_runner_user_conf puts it on Hydra's search path). Its layout is the package's
(``conf/experiment/NAME.yaml``, ``conf/model/NAME.yaml``, ``conf/prompts/NAME.yaml``, ...); an experiment
starts with ``# @package _global_`` as the packaged ones do. ``--config-dir DIR`` still adds any other
folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Optional

PACKAGED = "pkg://sdjax_runner.conf"
PROVIDER = "sdjax-runner user conf/"
FOLDER = "conf"
PACKAGE_CONF = Path(__file__).resolve().parent.parent / "conf"


def user_conf_dir(cwd: Optional[Path] = None) -> Optional[Path]:
    """``conf/`` of the working directory, absolute, when it is a folder (and not the package's own)."""
    folder = (cwd or Path.cwd()) / FOLDER
    if not folder.is_dir() or folder.resolve() == PACKAGE_CONF:
        return None
    return folder.resolve()


def shadowed(choices: Mapping[str, Optional[str]], cwd: Optional[Path] = None) -> list[str]:
    """``group/option`` for each chosen option (Hydra's runtime choices) that the user's conf/ and the
    package both have: the user's is the one in use."""
    folder = user_conf_dir(cwd)
    if folder is None:
        return []
    return [f"{group}/{option}" for group, option in sorted(choices.items())
            if option and not group.startswith("hydra") and (folder / group / f"{option}.yaml").is_file()
            and (PACKAGE_CONF / group / f"{option}.yaml").is_file()]
