"""What Hydra itself would trip over, refused with one line before it makes the run's folder and writes its
``.hydra/`` record.

Hydra makes the run (or sweep) folder and writes the composed config into ``.hydra/`` -- each prompt three
times: config.yaml, hydra.yaml, overrides.yaml -- before the run's own checks (config/plan.py's door) run. So
a prompt past the runner's bound (config/prompts.py; a 50 MB prompt from a PNG's infotext) would be written
out first, hundreds of MB, and a folder that cannot be made (under /proc, a read-only file system, no
permission) would be Hydra's mkdir traceback. This callback, the first Hydra calls, checks both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    InterpolationKeyError,
    OmegaConfBaseException,
    UnsupportedInterpolationType,
)

from sdjax_runner.config.checks import folder
from sdjax_runner.config.prompts import check_text
from sdjax_runner.errors import Refused, UserError


def prompts(config: DictConfig) -> None:
    """The prompts given inline (prompts.texts, prompts.negative), as written (an interpolation is the door's to
    resolve and report): text within the bounds."""
    given = cast(dict, OmegaConf.to_container(config.prompts, resolve=False))  # a section: a dict
    texts = given.get("texts")
    for number, text in enumerate(texts if isinstance(texts, list) else []):
        check_text(f"prompts.texts[{number}]", str(text))
    if given.get("negative"):
        check_text("prompts.negative", str(given["negative"]))


def interpolations(config: DictConfig) -> None:
    """Every ``${...}`` of the run's own settings names a key or resolver that exists. Checked before the run
    folder is named, since its name reads the command line's overrides (a prompt ``a ${nope}`` would fail
    there, named hydra.run.dir). Values that need a job (``${hydra:job.num}`` in a sweep) are left to it."""
    for key in config:
        if key == "hydra":
            continue
        try:
            value = config[key]  # a scalar is resolved as it is read, a section below
            if OmegaConf.is_config(value):
                OmegaConf.to_container(value, resolve=True)
        except (InterpolationKeyError, UnsupportedInterpolationType) as error:
            where = error.full_key or str(key)
            message = (getattr(error, "msg", None) or str(error)).split("\n")[0]
            raise UserError(where, message, "a value that resolves; for a literal '${', write '\\${'") from None


def run_folder(config: DictConfig, key: str) -> None:
    """``key`` (hydra.run.dir or hydra.sweep.dir) a folder this process can make; named as given, else as
    paths.output_root, which the default is under."""
    try:
        directory = Path(OmegaConf.select(config, key))
    except OmegaConfBaseException:  # an interpolation that fails: record/fresh_dirs.py's to report, as before
        return
    folder(key if given(config, key) else "paths.output_root", directory)


def given(config: DictConfig, key: str) -> bool:
    """Whether the command line names ``key`` (a Hydra setting: hydra.run.dir, hydra.sweep.dir)."""
    return any(o.startswith(f"{key}=") for o in config.hydra.overrides.hydra)


def writes(config: DictConfig) -> bool:
    """Whether this process writes the run's folder: all but processes 1.. of a multi-host run."""
    dist = config.parallelism.distributed
    return not dist.enabled or dist.process_id == 0


class StartChecks(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            prompts(config)
            HydraConfig.instance().set_config(config)  # settings and hydra.run.dir may read ${hydra:...}
            interpolations(config)
            if writes(config):
                run_folder(config, "hydra.run.dir")
        except UserError as error:
            raise Refused(error) from None  # (an Exception raised here would be a warning of Hydra's)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            prompts(config)
            interpolations(config)
            if writes(config):
                run_folder(config, "hydra.sweep.dir")
        except UserError as error:
            raise Refused(error) from None
