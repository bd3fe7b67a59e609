"""A sweep's values checked before the sweep starts: every swept value must compose against the schema
and pass the checks that need no device or model (:func:`.plan.check_values`), so a bad one is refused
with one line before the sweep directory, its tracker run or any job exists -- as a single run's bad
input is.

Values are checked one key at a time, the other swept keys at their first value: a key swept over N
values costs N checks, not its share of the whole product (1000 seeds are 1000 cheap checks, not 1000
compositions). A config group's value (``dtype=bf16,bogus``) is composed as Hydra will compose the job; any
other value is applied to the first job's config with Hydra's own override semantics (milliseconds). A
value that fails only beside another key's value, or only once the model is loaded, stays that job's
own error: the sweep goes on and its summary names the job.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from sdjax_runner.errors import UserError
from sdjax_runner.internals import BASIC_SWEEPER_TARGET, apply_hydra_overrides

# The sweepers that run every point of the command line: Hydra's basic one and ours, which are it (the default,
# checked, and resume: hydra_plugins/sdjax_runner_resume/resume_sweeper.py).
LISTING_SWEEPERS = (BASIC_SWEEPER_TARGET, "hydra_plugins.sdjax_runner_resume.resume_sweeper.CheckedSweeper",
                    "hydra_plugins.sdjax_runner_resume.resume_sweeper.ResumeSweeper")


def check_points(config: DictConfig, task: list[str]) -> None:
    """Raise the first bad swept value's error (ConfigCompositionException, UserError, ...), else nothing."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sdjax_runner.config.checks import run_values
    from sdjax_runner.config.modes import IMAGE_KEYS
    from sdjax_runner.config.plan import admit, check_values

    batch = config.hydra.sweeper.get("max_batch_size")
    if config.hydra.sweeper._target_ in LISTING_SWEEPERS and batch is not None and batch < 1:
        raise UserError("hydra.sweeper.max_batch_size", f"must be a positive number of jobs, got {batch}",
                        "1, 2, 3, ... or null for all the jobs at once")  # else Hydra's AssertionError, mid-sweep
    loader = GlobalHydra.instance().config_loader()
    parser = OverridesParser.create(config_loader=loader)  # glob(...) lists a group's options through it
    parsed = parser.parse_overrides(task)
    sampled = next((o for o in parsed if o.is_sweep_override() and not o.is_discrete_sweep()), None)
    if sampled is not None:
        if config.hydra.sweeper._target_ not in LISTING_SWEEPERS:
            return  # a sweeper that samples (Optuna, Ax, ...) checks its own search space
        raise UserError(sampled.get_key_element().lstrip("+~"), "an interval is a search space, and this sweeper "
                        "runs a list of points", "a,b,c, range(start,stop[,step]), glob(...)")
    lines = [_values(o) for o in parsed]
    swept = [i for i, o in enumerate(parsed) if o.is_discrete_sweep() and not _is_hydra(o)]
    first_job = [values[0] for values in lines]
    first = loader.load_sweep_config(config, first_job)
    check_values(admit(first))  # (a -m of one point too: refused like a list's bad value, no sweep started)
    if not swept:
        return
    for i in swept:
        values = list(dict.fromkeys(lines[i][1:]))  # each distinct value once
        if loader.get_group_options(parsed[i].key_or_group.split("@")[0]):
            for line in values:  # another option: another defaults tree
                check_values(admit(loader.load_sweep_config(config, [*first_job[:i], line, *first_job[i + 1:]])))
            continue
        # The first job has this key (set by its first value): each value is set in place, checked,
        # and the first value set back -- no copy of the config per value.
        key = parsed[i].key_or_group.lstrip("+~")
        # The prompts (a file of 100,000 lines takes ~40 ms to read) depend on prompts.* alone, the images
        # read on their keys.
        check = check_values if key.startswith("prompts.") or key in IMAGE_KEYS else run_values
        for line in [*values, lines[i][0]]:
            apply_hydra_overrides(parser.parse_overrides([key + line[line.index("="):]]), first)
            check(admit(first))


def _values(override: Any) -> list[str]:
    """The ``key=value`` lines of one override, as Hydra's basic sweeper writes them for its jobs."""
    key = override.get_key_element()
    if override.is_sweep_override():
        return [f"{key}={value}" for value in override.sweep_string_iterator()]
    return [f"{key}={override.get_value_element_as_str()}"]


def _is_hydra(override: Any) -> bool:
    """``hydra.*`` and ``hydra/...`` (launcher settings and the like): Hydra's to check, not the job's."""
    return override.key_or_group.lstrip("+~").split(".")[0].split("/")[0] == "hydra"
