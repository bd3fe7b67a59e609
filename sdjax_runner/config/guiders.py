"""Guiders: how a step combines the denoiser's unconditional and conditional predictions (``guider=NAME``,
``guider.*``), one :class:`GuiderEntry` each. ``sampling.guidance_scale`` stays the weight every guider applies (the
CFG weight, as in diffusers' guiders); a guider's own settings are traced inputs of the program, so a sweep over them
(or over the guidance scale) compiles once, while the guider's name shapes the program.

How each guider computes is engine/'s (``engine/guiders.py``: one function per entry, checked against this registry
when imported). A guider is offered by ``guider=NAME`` through Hydra's config group ``guider``, which
:func:`register` fills from this registry (no YAML file per guider). A new guider is an entry here and its function
there (docs/architecture.md, "Where a new guider goes").

Like classifier-free guidance itself, a guider runs where ``sampling.guidance_scale`` is over 1 (else the conditional
prediction runs alone: config/families.py). A family runs the guiders its entry lists (``FamilyEntry.guiders``); the
others are one line.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Optional

from sdjax_runner.config import choices
from sdjax_runner.errors import UserError

log = logging.getLogger("sdjax_runner")

DEFAULT = "cfg"


@dataclass(frozen=True)
class GuiderEntry:
    """What the config knows of one guider."""

    name: str  # guider=NAME
    reads: tuple[str, ...] = ()  # the guider.* settings it reads (schema.GuiderConfig's fields), each a traced input
    # It adds a denoiser call on the conditional input with the self-attention of guider.layers perturbed (PAG): the
    # static part, which shapes the program (the UNet's batch grows by a half).
    perturbs: bool = False
    # It reweighs the UNet's first up blocks' features by its settings (FreeU) and combines the predictions as CFG.
    reweighs: bool = False
    # It adds a denoiser call on the conditional input with the transformer blocks guider.layers skipped, on the steps
    # of its own window (skip-layer guidance): the static part, the layers; the call runs under lax.cond.
    skips: bool = False

    @property
    def changes_the_unet(self) -> bool:
        """Whether it runs inside the SD family's UNet (PAG, FreeU): what the flow families' transformers and SDXL's
        refiner do not take here."""
        return self.perturbs or self.reweighs


GUIDERS = {entry.name: entry for entry in (
    # classifier-free guidance (Ho & Salimans 2022): uncond + g (cond - uncond)
    GuiderEntry("cfg"),
    # CFG-Zero* (Fan et al. 2025, diffusers' ClassifierFreeZeroStarGuidance): the unconditional prediction scaled by
    # its optimal projection on the conditional one, zero on the first zero_init_steps steps
    GuiderEntry("cfg_zero_star", ("zero_init_steps",)),
    # adaptive projected guidance (Sadat et al. 2024, diffusers' AdaptiveProjectedGuidance without momentum): the
    # update's norm capped at norm_threshold, its part parallel to the conditional prediction weighted by eta
    GuiderEntry("apg", ("eta", "norm_threshold")),
    # perturbed-attention guidance (Ahn et al. 2024, diffusers' PAG pipelines): a third prediction on the conditional
    # input with the self-attention of guider.layers perturbed (a UNet's: the identity, each token its own value; SD
    # 3's joint attention: each image token sees itself alone among the image tokens); the SD family and SD 3;
    # uncond + g (cond - uncond) + s (cond - perturbed), s = scale, or max(0, scale - adaptive_scale (1000 - t))
    GuiderEntry("pag", ("scale", "adaptive_scale"), perturbs=True),
    # smoothed-energy guidance (Hong 2024, its published SEG-SDXL pipeline): PAG's third prediction, with the queries
    # of guider.layers' self-attention blurred over the image by a Gaussian of blur_sigma (above 9999: each query
    # the mean of its image's) instead (SD 3: the image queries of the picked blocks); the SD family and SD 3;
    # uncond + g (cond - uncond) + scale (cond - perturbed)
    GuiderEntry("seg", ("scale", "blur_sigma"), perturbs=True),
    # FreeU (Si et al. 2024, diffusers' enable_freeu): CFG, with the UNet's first two up blocks' backbone features
    # (half their channels) scaled by b1, b2 and their skip features' lowest frequencies by s1, s2
    GuiderEntry("freeu", ("b1", "b2", "s1", "s2"), reweighs=True),
    # skip-layer guidance (diffusers' SkipLayerGuidance and StableDiffusion3Pipeline's skip_guidance_layers; SD 3.5
    # Medium's card): CFG, plus scale * (cond - cond without the transformer blocks guider.layers) on the steps i with
    # skip_start * steps < i < skip_stop * steps; SD 3
    GuiderEntry("skip_layer", ("scale", "skip_start", "skip_stop"), skips=True),
)}

# The guiders that only combine the predictions the step already makes (nothing inside the UNet): what a family
# whose denoiser takes no change (FLUX.1's transformer, for now) runs; SD 3 runs these, pag, seg and skip_layer.
COMBINING = tuple(name for name, entry in GUIDERS.items() if not (entry.changes_the_unet or entry.skips))
# The guiders a UNet runs: all but those that skip transformer blocks
ON_A_UNET = tuple(name for name, entry in GUIDERS.items() if not entry.skips)
# skip_layer's own default weight (diffusers' skip_layer_guidance_scale, SD 3.5 Medium's card): its group option sets
# it (register)
DEFAULTS = {"skip_layer": {"scale": 2.8}}


# Every guider's window (diffusers' BaseGuidance start and stop: the guidance interval of Kynkäänniemi et al. 2024):
# settings of every guider, not traced -- the window shapes the program (None: every step, the default program).
WINDOW = ("start", "stop")
# A perturbing guider's layers: patterns (regular expressions, as diffusers' pag_applied_layers) matched against the
# denoiser's self-attention modules by their PyTorch names (down_blocks.1.attentions.0.transformer_blocks.0.attn1);
# static: they shape the program.
LAYERS = "layers"


@dataclass(frozen=True)
class Guider:
    """The guider a run uses: its name, the settings it reads, as numbers (the program's traced inputs), and its
    window, (start, stop) fractions of the steps that run where it guides, or None (every step)."""

    name: str = DEFAULT
    settings: tuple[tuple[str, float], ...] = ()
    window: Optional[tuple[float, float]] = None
    layers: tuple[str, ...] = ()  # a perturbing guider's guider.layers (else empty)

    @property
    def plain(self) -> bool:
        """Classifier-free guidance on every step: what a run without guider settings does (nothing to say)."""
        return self.name == DEFAULT and self.window is None

    @property
    def recorded(self) -> tuple[tuple[str, float], ...]:
        """The settings and the window as the records give them."""
        return self.settings + (tuple(zip(WINDOW, self.window, strict=True)) if self.window else ())

    @property
    def label(self) -> str:
        """``apg (eta 0.5, norm_threshold 15)``: for the plan line."""
        label = choices.label(self.name, self.recorded)
        return f"{label} on {', '.join(self.layers)}" if self.layers else label


def check(config: Any, family: Any) -> Guider:
    """The run's guider (``config.guider``) for a model of ``family`` (config/families.FamilyEntry); raises UserError
    naming the key. A setting the guider does not read is said in one line and left out (a sweep over guiders with
    one guider's setting runs its other points without it)."""
    given = config.guider  # a schema.GuiderConfig
    name = str(given.name)
    entry = choices.chosen("guider", name, GUIDERS, family.guiders, config, family)
    if entry.changes_the_unet and config.model.refiner:
        raise UserError("guider", f"{name} with model.refiner: it runs inside the base's UNet, not the refiner's, here",
                        f"guider={name} without a refiner, or another guider with it")
    settings = choices.settings_read("guider", given, name, GUIDERS, _check_value, apart=(*WINDOW, LAYERS))
    if entry.skips and not given.skip_start < given.skip_stop:
        raise UserError("guider.skip_start", f"{given.skip_start:g}, skip_stop {given.skip_stop:g}",
                        "0 <= skip_start < skip_stop <= 1, fractions of the steps")
    return Guider(name, settings, _window(given), _layers(given, entry, family))


def _layers(given: Any, entry: GuiderEntry, family: Any) -> tuple[str, ...]:
    """``guider.layers`` for a perturbing guider (unset: the family's default, FamilyEntry.perturbed_layers), each
    a valid pattern (which modules they match is the loaded model's: the family checks it); said and left out for
    another guider where set."""
    import re

    if entry.skips:
        return _skipped_blocks(given.layers)
    if given.layers is None:
        return tuple(family.perturbed_layers) if entry.perturbs else ()
    layers = tuple(str(layer) for layer in given.layers)
    if not entry.perturbs:
        if layers:
            readers = [other.name for other in GUIDERS.values() if other.perturbs or other.skips]
            log.warning("guider.layers: %s is read by %s; guider=%s runs without it", list(layers),
                        " and ".join(readers), entry.name)
        return ()
    if not layers:
        raise UserError("guider.layers", "no layers", f"{ALLOWED_LAYERS}, e.g. [mid]")
    for layer in layers:
        try:
            re.compile(layer)
        except re.error as exc:
            raise UserError("guider.layers", f"{layer[:60]!r} is no regular expression ({exc})", ALLOWED_LAYERS) from None
        if not layer or "," in layer:
            raise UserError("guider.layers", f"{layer[:60]!r}", f"{ALLOWED_LAYERS}, with no comma")
    return layers


def _skipped_blocks(layers: Any) -> tuple[str, ...]:
    """skip_layer's ``guider.layers``: distinct transformer block numbers (the family checks them against the loaded
    model), required."""
    allowed = "distinct transformer block numbers, e.g. [7, 8, 9] (SD 3.5 Medium's card)"
    if layers is None:
        raise UserError("guider.layers", "a value is required with guider=skip_layer", allowed)
    blocks = tuple(str(layer).strip() for layer in layers)
    if not blocks or len(set(blocks)) != len(blocks) or not all(
            block.isascii() and block.isdigit() and len(block) < 4 for block in blocks):
        raise UserError("guider.layers", f"{[block[:20] for block in blocks][:20]}", allowed)
    return tuple(str(int(block)) for block in blocks)


def _window(given: Any) -> Optional[tuple[float, float]]:
    """``guider.start`` and ``guider.stop``, checked; None for the whole of the steps."""
    start, stop = float(given.start), float(given.stop)
    if not (math.isfinite(start) and math.isfinite(stop) and 0 <= start < stop <= 1):
        key = "guider.start" if not (math.isfinite(start) and 0 <= start < 1) else "guider.stop"
        raise UserError(key, f"start {start:g}, stop {stop:g}", "0 <= start < stop <= 1, fractions of the steps")
    return None if (start, stop) == (0.0, 1.0) else (start, stop)


def _check_value(key: str, value: Any) -> None:
    if not math.isfinite(value):
        raise UserError(f"guider.{key}", f"must be a finite number, got {value}", ALLOWED[key])
    if key in ("zero_init_steps", "norm_threshold", "adaptive_scale") and value < 0:
        raise UserError(f"guider.{key}", f"must be >= 0, got {value}", ALLOWED[key])
    if key == "blur_sigma" and value <= 0:
        raise UserError(f"guider.{key}", f"must be > 0, got {value}", ALLOWED[key])
    if key in ("skip_start", "skip_stop") and not 0 <= value <= 1:
        raise UserError(f"guider.{key}", f"must be a fraction of the steps, got {value}", ALLOWED[key])


ALLOWED_LAYERS = ("patterns of the denoiser's self-attention modules by their PyTorch names, as diffusers' "
                  "pag_applied_layers: mid, down_blocks.1, up_blocks.0.attentions.1 (a UNet), blocks.1 (SD 3), ...")
FREEU_VALUES = ("a number (FreeU's published values: SD 1.4 and XL b1 1.3, b2 1.4, s1 0.9, s2 0.2; SD 1.5 b1 1.5, "
                "b2 1.6; SD 2.1 b1 1.4, b2 1.6; 1: unchanged)")
ALLOWED = {"zero_init_steps": "0 (none), 1 (diffusers' default), 2, ...",
           "eta": "a number: 1 keeps the parallel part (plain CFG's update), 0 drops it (diffusers' default 1)",
           "norm_threshold": "0 (no cap) or a positive number (diffusers' default 15)",
           "scale": "a number: pag's and seg's weight of cond - perturbed (diffusers' pag_scale, SEG's seg_scale, "
                    "default 3), skip_layer's of cond - cond without its blocks (default 2.8); 0: plain CFG's images",
           **dict.fromkeys(("skip_start", "skip_stop"), "fractions of the steps, 0 <= skip_start < skip_stop <= 1 "
                                                         "(diffusers' 0.01 and 0.2)"),
           "blur_sigma": "a positive number: seg's blur of the queries, in latent pixels (SEG's seg_blur_sigma: 1, "
                         "10, ...; over 9999, as its default 9999999: infinite, each query its image's mean)",
           **dict.fromkeys(("b1", "b2", "s1", "s2"), FREEU_VALUES),
           "adaptive_scale": "0 (a constant scale, diffusers' default) or a positive number: the scale falls by it per "
                             "timestep below 1000"}


def register(store: Any) -> None:
    """Hydra's config group ``guider``: one option per entry, setting its name (``guider=apg``)."""
    for entry in GUIDERS.values():
        store.store(group="guider", name=entry.name, node={"name": entry.name, **DEFAULTS.get(entry.name, {})})
