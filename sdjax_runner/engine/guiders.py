"""How a step combines the denoiser's predictions: one function per guider of config/guiders.py (``guider=NAME``).

Each takes the unconditional and conditional predictions (float32, a batch of images), the guidance scale (traced),
the guider's settings (traced numbers, by the names its entry reads) and the step's index among the steps that run
(traced: 0 at the first), and gives the guided prediction. A sampler calls :func:`guided` with a :class:`Guidance`:
the guider's name (static: it shapes the program), the scale, CFG rescale where it runs, and the settings.

Each function transcribes diffusers' guider of the same name (diffusers/guiders/, 0.39) in JAX; tests/test_guiders.py
holds them to a NumPy transcription of that code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from sdjax_runner.config.guiders import GUIDERS as ENTRIES

GUIDER_INPUT = "guider_"  # a guider's setting KEY is the program's traced input guider_KEY (engine/generate.py)


@dataclass(frozen=True)
class Guidance:
    """What a sampler needs to guide: ``guider`` (its name), ``scale`` (sampling.guidance_scale, traced), ``rescale``
    (CFG rescale's traced factor, or None where it does not run), ``settings`` (the guider's traced numbers) and
    ``true_scale`` (FLUX.1's true CFG, sampling.true_cfg_scale, traced, or None where it does not run: its ``scale``
    is the distilled guidance the transformer embeds)."""

    scale: Any
    guider: str = "cfg"
    rescale: Optional[Any] = None
    settings: dict = field(default_factory=dict)
    true_scale: Optional[Any] = None
    window: Optional[tuple[float, float]] = None  # guider.start/stop: (start, stop) fractions, or None (every step)
    # The step cache's traced settings (cache.*, by name: engine/caches.py), or None: every denoiser call runs the
    # whole model. Carried here because every sampler already takes how it is to call the denoiser from this.
    cache: Optional[dict] = None
    # A perturbing guider's (pag's, seg's) guider.layers: the denoiser is also called on the conditional input with the
    # self-attention they pick perturbed (engine/samplers/unet.py), and the guider reads that third prediction.
    perturbed: Optional[tuple[str, ...]] = None
    # skip_layer's guider.layers, the transformer blocks its extra call skips (families/sd3/engine/stages.py), or None
    skipped: Optional[tuple[int, ...]] = None

    @property
    def query_blur(self) -> Any:
        """How the perturbed chunk's self-attention runs: a guider that reads ``blur_sigma`` (SEG) blurs its queries by
        that traced sigma; None: PAG's perturbation, the model's own."""
        return self.settings.get("blur_sigma")


def _per_image_sum(array, keepdims: bool = True):
    import jax.numpy as jnp

    return jnp.sum(array, axis=tuple(range(1, array.ndim)), keepdims=keepdims)


def cfg(unconditional, conditional, scale, settings: dict, step):
    """diffusers' ClassifierFreeGuidance: ``uncond + scale * (cond - uncond)``."""
    return unconditional + scale * (conditional - unconditional)


def cfg_zero_star(unconditional, conditional, scale, settings: dict, step):
    """diffusers' ClassifierFreeZeroStarGuidance: ``alpha * uncond + scale * (cond - uncond)``, alpha each image's
    ``<cond, uncond> / (|uncond|^2 + 1e-8)``; zeros on the steps before ``zero_init_steps``."""
    import jax.numpy as jnp

    alpha = _per_image_sum(conditional * unconditional) / (_per_image_sum(unconditional**2) + 1e-8)
    guided_ = unconditional * alpha + scale * (conditional - unconditional)
    return jnp.where(step < settings["zero_init_steps"], jnp.zeros_like(guided_), guided_)


def apg(unconditional, conditional, scale, settings: dict, step):
    """diffusers' AdaptiveProjectedGuidance without momentum (``normalized_guidance``): the update ``cond - uncond``
    with its norm capped at ``norm_threshold`` (0: no cap), split into its parts parallel and orthogonal to the
    conditional prediction, recombined as ``orthogonal + eta * parallel``; ``uncond + scale * update``. (diffusers
    projects in float64; float32 here.)"""
    import jax.numpy as jnp

    diff = conditional - unconditional
    threshold = settings["norm_threshold"]
    norm = jnp.sqrt(_per_image_sum(diff**2))
    capped = diff * jnp.minimum(1.0, threshold / norm)
    diff = jnp.where(threshold > 0, capped, diff)
    unit = conditional / jnp.maximum(jnp.sqrt(_per_image_sum(conditional**2)), 1e-12)  # torch's F.normalize
    parallel = _per_image_sum(diff * unit) * unit
    return unconditional + scale * (diff - parallel + settings["eta"] * parallel)


def pag(guided_, conditional, perturbed, settings: dict, timestep):
    """diffusers' PAG pipelines (PAGMixin's ``_apply_perturbed_attention_guidance``): ``guided_`` -- classifier-free
    guidance's ``uncond + g (cond - uncond)``, or without it the conditional prediction -- plus ``s (cond -
    perturbed)``, ``s`` the scale, or with ``adaptive_scale`` a > 0 ``max(0, scale - a (1000 - t))`` at the call's
    ``timestep`` t. At s 0 ``guided_`` itself, bit for bit."""
    import jax.numpy as jnp

    scale, adaptive = settings["scale"], settings["adaptive_scale"]
    scale = jnp.where((adaptive > 0) & (scale > 0),
                      jnp.maximum(scale - adaptive * (1000 - jnp.asarray(timestep, jnp.float32)), 0.0), scale)
    return _plus_perturbed(guided_, conditional, perturbed, scale)


def seg(guided_, conditional, perturbed, settings: dict, timestep):
    """SEG-SDXL's combination (its pipeline's ``noise_pred_text + (g - 1) (noise_pred_text - noise_pred_uncond) +
    seg_scale (noise_pred_text - noise_pred_text_perturb)``, or without CFG ``noise_pred_text + seg_scale (...)``):
    ``guided_`` -- ``uncond + g (cond - uncond)``, or the conditional prediction -- plus ``scale (cond - perturbed)``.
    At scale 0 ``guided_`` itself, bit for bit."""
    return _plus_perturbed(guided_, conditional, perturbed, settings["scale"])


def _plus_perturbed(guided_, conditional, perturbed, scale):
    """``guided_ + scale (cond - perturbed)`` in float32; ``guided_`` itself, bit for bit, where the scale is 0."""
    import jax.numpy as jnp

    out = guided_ + scale * (conditional.astype(jnp.float32) - perturbed.astype(jnp.float32))
    return jnp.where(scale == 0, guided_, out)


# How each guider combines the unconditional and conditional predictions (the guiders that change the UNet, PAG, SEG
# and FreeU, as CFG; skip-layer guidance as CFG, its term added by SD 3's sampler: families/sd3/engine/stages.py); a
# perturbing guider (config/guiders.py: GuiderEntry.perturbs) then adds its term (PERTURBING).
GUIDERS: dict[str, Callable] = {"cfg": cfg, "cfg_zero_star": cfg_zero_star, "apg": apg, "pag": cfg, "seg": cfg,
                                "freeu": cfg, "skip_layer": cfg}
PERTURBING: dict[str, Callable] = {"pag": pag, "seg": seg}
assert set(GUIDERS) == set(ENTRIES), "engine/guiders.py and config/guiders.py name the same guiders"
assert set(PERTURBING) == {name for name, entry in ENTRIES.items() if entry.perturbs}


def guided(unconditional, conditional, guidance: Guidance, step, steps=None, perturbed=None, timestep=None):
    """The guided prediction in float32: ``guidance.guider``'s, then CFG rescale where it runs (diffusers applies
    ``rescale_noise_cfg`` after every guider); outside the guider's window the conditional prediction.
    ``unconditional`` None (no classifier-free guidance, Spec.cfg): the conditional prediction itself (with a
    perturbing guider, plus its term). ``step``: the step's index among those that run (0 at the first), ``steps``:
    how many run (read by a window alone); ``perturbed``: a perturbing guider's third prediction (the denoiser on
    the conditional input, perturbed), ``timestep``: the call's (read by an adaptive scale)."""
    import jax.numpy as jnp

    if unconditional is None:
        out = conditional.astype(jnp.float32)
        if perturbed is None:
            return out
        out = PERTURBING[guidance.guider](out, conditional, perturbed, guidance.settings, timestep)
    else:
        out = _combined(unconditional, conditional, guidance, step, perturbed, timestep)
    if guidance.window is None:
        return out
    return jnp.where(within(step, steps, *guidance.window), out, conditional.astype(out.dtype))


def place(sigma, sigmas):
    """A k sampler's step: the index of the sigma of its schedule (``sigmas``, host constants) nearest ``sigma``."""
    import jax.numpy as jnp

    return jnp.argmin(jnp.abs(jnp.asarray(sigmas, jnp.float32) - sigma))


def flow_step(index, sigma, sigmas, steps: int) -> tuple[Any, Any]:
    """The guider's (step, how many run) on a flow family: the Euler loop's ``index`` of ``steps``, else ``sigma``'s
    :func:`place` among a k sampler's ``sigmas`` (the last, 0, ends the schedule)."""
    if index is not None:
        return index, steps
    assert sigmas is not None  # the k samplers pass their sigmas
    return place(sigma, sigmas), len(sigmas) - 1


def within(step, steps, start: float, stop: float):
    """diffusers' BaseGuidance window: ``int(start * steps) <= step < int(stop * steps)``."""
    import jax.numpy as jnp

    first: Any
    end: Any
    if isinstance(steps, int):  # Python's int(), as diffusers computes the bounds
        first, end = int(start * steps), int(stop * steps)
    else:  # a traced count (img2img's steps hang on its traced start)
        count = jnp.asarray(steps, jnp.float32)
        first, end = jnp.floor(start * count), jnp.floor(stop * count)
    return (first <= step) & (step < end)


def _combined(unconditional, conditional, guidance: Guidance, step, perturbed=None, timestep=None):
    import jax.numpy as jnp

    if GUIDERS[guidance.guider] is cfg:  # the guide's expression, bit for bit: a float32 [scale], as diffusers'
        # Flax pipelines make it, promotes the predictions (in the UNet's dtype) to float32
        out = cfg(unconditional, conditional, jnp.array([guidance.scale], dtype=jnp.float32), {}, step)
    else:  # in float32, as diffusers' guiders compute
        out = GUIDERS[guidance.guider](unconditional.astype(jnp.float32), conditional.astype(jnp.float32),
                                       jnp.ravel(jnp.asarray(guidance.scale, jnp.float32))[0], guidance.settings, step)
    if perturbed is not None:  # a perturbing guider's term, before CFG rescale (as diffusers' PAG pipelines)
        out = PERTURBING[guidance.guider](out, conditional, perturbed, guidance.settings, timestep)
    return out if guidance.rescale is None else rescaled(out, conditional, guidance.rescale)


def rescaled(cfg, conditional, rescale):
    """diffusers' ``rescale_noise_cfg`` (Lin et al. 2023, "Common Diffusion Noise Schedules and Sample Steps are
    Flawed", eq. 15-16): each image's guided prediction scaled to the conditional prediction's standard deviation,
    mixed in by ``rescale``: ``rescale * cfg * std(cond) / std(cfg) + (1 - rescale) * cfg``. (diffusers' torch.std is
    Bessel-corrected, the plain one here: the correction cancels in the ratio.) At 0 the guided prediction itself,
    exactly."""
    import jax.numpy as jnp

    axes = tuple(range(1, cfg.ndim))
    ratio = jnp.std(conditional, axis=axes, keepdims=True) / jnp.std(cfg, axis=axes, keepdims=True)
    factor = jnp.ravel(jnp.asarray(rescale, jnp.float32))[0]
    blended = factor * (cfg * ratio) + (1 - factor) * cfg
    return jnp.where(factor > 0, blended, cfg)
