"""Step caches: a denoiser call that reuses what an earlier step computed instead of running the whole model
(``cache=NAME``, ``cache.*``), one :class:`CacheEntry` each. The cache's name shapes the program; its settings are
traced inputs, so a sweep over them (a threshold sweep) compiles once, and the skip is decided on the device, in
the one compiled program (``lax.cond``).

How each cache computes is the family's (a family lists the caches it runs: ``FamilyEntry.caches``; FLUX.1's
transformer runs ``first_block`` and ``magcache``, families/flux/models/transformer.py; SD 3's ``first_block``; the SD
family's UNet ``deepcache``, engine/samplers/deep_cache.py). A cache is offered by ``cache=NAME``
through Hydra's config group ``cache``, which :func:`register` fills from this registry (no YAML file per cache).
A new cache is an entry here and its computation in the families that run it (docs/architecture.md, "Where a new
piece goes").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sdjax_runner.config import choices
from sdjax_runner.config.guiders import GUIDERS
from sdjax_runner.errors import UserError

DEFAULT = "none"


@dataclass(frozen=True)
class CacheEntry:
    """What the config knows of one step cache."""

    name: str  # cache=NAME
    title: str  # what it is, for people (the plan line, the docs)
    reads: tuple[str, ...] = ()  # the cache.* settings it reads (schema.CacheConfig's fields), each a traced input
    # its own defaults where they are not the schema's (cache=NAME sets them; cache.KEY=VALUE overrides)
    defaults: tuple[tuple[str, float], ...] = ()
    # those of its settings that shape the program instead (Spec.cache_shape; a sweep over one compiles per value)
    shapes: tuple[str, ...] = ()


CACHES = {entry.name: entry for entry in (
    CacheEntry("none", "no step cache: every denoiser call runs the whole model"),
    # First-Block Cache (ParaAttention; diffusers' FirstBlockCacheConfig / apply_first_block_cache): the first
    # transformer block always runs; where its output's residual changed by a relative mean absolute difference of
    # at most the threshold since the last call that ran every block, the other blocks are skipped and the residual
    # they added then is added again
    CacheEntry("first_block", "First-Block Cache (diffusers' FirstBlockCacheConfig)", ("threshold",)),
    # MagCache (Ma et al. 2025; diffusers' MagCacheConfig / apply_mag_cache): from the retention step on, the model's
    # published magnitude ratio of each step multiplies an accumulated ratio whose distance from 1 adds to an
    # accumulated error; while that error is at most the threshold and at most max_skip_steps calls have
    # accumulated, a call skips every block and adds the whole stack's residual of the last full call to its input
    CacheEntry("magcache", "MagCache (diffusers' MagCacheConfig, the model's published ratios)",
               ("threshold", "max_skip_steps", "retention_ratio"), (("threshold", 0.06),)),
    # DeepCache (Ma, Fang and Wang 2024; horseee/DeepCache's DeepCacheSDHelper, "uniform"): a UNet's call every
    # interval steps runs whole and keeps the input of its branch's up layer; the calls between run the shallow layers
    # alone -- the down path before the branch, the up path from it, on that kept input. Its README's example
    # settings (interval 3, branch 0: the shallowest) are the defaults; the branch shapes the program.
    CacheEntry("deepcache", "DeepCache (horseee/DeepCache's DeepCacheSDHelper)", ("interval", "branch"),
               (("interval", 3),), shapes=("branch",)),
)}


@dataclass(frozen=True)
class Cache:
    """The step cache a run uses: its name and the settings it reads, as numbers (the program's traced inputs)."""

    name: str = DEFAULT
    settings: tuple[tuple[str, float], ...] = ()

    @property
    def plain(self) -> bool:
        """No cache: what a run without cache settings does (nothing to say, nothing recorded)."""
        return self.name == DEFAULT

    @property
    def shaping(self) -> tuple[tuple[str, float], ...]:
        """The settings that shape the program (the entry's ``shapes``)."""
        return tuple((key, value) for key, value in self.settings if key in CACHES[self.name].shapes)

    @property
    def traced(self) -> tuple[tuple[str, float], ...]:
        """The settings that are the program's traced inputs (the others)."""
        return tuple((key, value) for key, value in self.settings if key not in CACHES[self.name].shapes)

    @property
    def label(self) -> str:
        """``first_block (threshold 0.05)``: for the plan line."""
        return choices.label(self.name, self.settings)


def check(config: Any, family: Any, own_sampler: bool) -> Cache:
    """The run's step cache (``config.cache``) for a model of ``family`` (config/families.FamilyEntry) whose sampler
    is the model's own (``own_sampler``: the cache carries its state through that sampler's steps); raises
    UserError naming the key. A setting the cache does not read is said in one line and left out."""
    given = config.cache  # a schema.CacheConfig
    name = str(given.name)
    choices.chosen("cache", name, CACHES, family.caches, config, family)
    if name != DEFAULT and not own_sampler:
        raise UserError("cache", f"{name} with sampler {config.sampler}: the cache's state is carried through the "
                        "model's own sampler's steps", "the model's own sampler (sampler=null; FLUX.1 and SD 3: "
                        "euler too), or none")
    if name != DEFAULT and config.model.refiner:
        raise UserError("cache", f"{name} with model.refiner: the refiner's UNet takes over mid-run, and the cache "
                        "keeps one model's state; not run here yet", "none, or without a refiner")
    if name != DEFAULT and getattr(config.sampling, "true_cfg_scale", None) is not None:
        raise UserError("cache", f"{name} with sampling.true_cfg_scale: true CFG makes two transformer calls a step, "
                        "whose caches diffusers keeps apart; not run here yet", "none, or without true CFG")
    guider = GUIDERS.get(str(config.guider.name))
    if name != DEFAULT and guider is not None and guider.skips:
        raise UserError("cache", f"{name} with guider={guider.name}: skip-layer guidance makes a second transformer "
                        "call on its steps, which the cache's one state a step does not follow; not run here yet",
                        "none, or another guider")
    if name != DEFAULT and guider is not None and guider.perturbs:
        raise UserError("cache", f"{name} with guider={guider.name}: its perturbed chunk changes what the blocks "
                        "compute; not run here yet", "none, or a guider that only combines predictions")
    return Cache(name, choices.settings_read("cache", given, name, CACHES, _check_value))


def _check_value(key: str, value: Any) -> None:
    if not (math.isfinite(value) and value >= 0) or (key == "retention_ratio" and value > 1) \
            or (key in WHOLE and value != int(value)) or (key == "interval" and value < 1):
        raise UserError(f"cache.{key}", f"{value}", ALLOWED[key])


WHOLE = ("max_skip_steps", "interval", "branch")  # (the schema types them int; an infotext's text is checked here)


ALLOWED = {"threshold": "a number >= 0: first_block's largest relative change of the first block, magcache's largest "
                        "accumulated error, under which blocks are skipped (diffusers' defaults 0.05 and 0.06; 0 runs "
                        "every block)",
           "max_skip_steps": "a whole number >= 0: magcache's most calls skipped in a row (diffusers' default 3)",
           "retention_ratio": "a number from 0 to 1: magcache's share of the first steps that always run (diffusers' "
                              "default 0.2)",
           "interval": "a whole number >= 1: deepcache's steps from one whole UNet call to the next (1: every call "
                       "whole; DeepCache's example 3)",
           "branch": "a whole number >= 0: deepcache's branch, shallowest first (DeepCache's cache_branch_id: its "
                     "level branch // 3 and layer branch % 3; 0, the shallowest, skips the most)"}


def register(store: Any) -> None:
    """Hydra's config group ``cache``: one option per entry, setting its name (``cache=first_block``)."""
    for entry in CACHES.values():
        store.store(group="cache", name=entry.name, node={"name": entry.name, **dict(entry.defaults)})
