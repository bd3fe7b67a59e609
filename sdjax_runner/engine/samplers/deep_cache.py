"""DeepCache on the SD family's UNet (``cache=deepcache``; Ma, Fang and Wang 2024), as horseee/DeepCache's
``DeepCacheSDHelper`` runs it with ``skip_mode="uniform"``, in the one compiled program: the choice between the
whole UNet and its shallow branch is made on the device (``lax.cond``), so a sweep over ``cache.interval`` compiles
once, and interval 1 runs every call whole (the plain images, bit for bit).

The helper numbers a call by the first index of its timestep in the scheduler's timesteps (``list(timesteps).index(t)``:
PNDM's repeated timestep counts twice as the first of the pair) and runs the whole UNet where that number, less the
first call's, is a multiple of the interval; such a call keeps what the branch's first running up layer received. The
calls between run the branch alone (families/sd/models/unet.DeepCache: which layers, and where the kept input goes
in). Classifier-free guidance's two halves are one UNet call, so one kept input serves both."""

from __future__ import annotations

from typing import Any, NamedTuple

from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance
from sdjax_runner.engine.samplers import unet
from sdjax_runner.families.sd.models.unet import DeepCache

LEVEL_LAYERS = 3  # DeepCache's branch numbering: cache_block_id = branch // 3, cache_layer_id = branch % 3


class DeepCacheState(NamedTuple):
    """What the sampler's loop carries under DeepCache."""

    kept: Any  # the branch's input at the last whole call (zeros before the first, which is always whole)
    skipped: Any  # int32: the calls that ran the branch alone, on this device


def branch(shape: tuple) -> DeepCache:
    """The run's branch (``spec.cache_shape``: ``(("branch", value),)``) as the UNet's :class:`DeepCache`."""
    number = int(dict(shape)["branch"])
    return DeepCache(number // LEVEL_LAYERS, number % LEVEL_LAYERS)


def call_number(timesteps, index):
    """The helper's number of the call at step ``index``: the first position of its timestep in ``timesteps``."""
    import jax.numpy as jnp

    return jnp.argmax(timesteps == timesteps[index])


def whole_call(guidance: Guidance, timesteps, index, start):
    """Whether the call at step ``index`` runs the whole UNet: its number less the first call's (at ``start``) a
    multiple of the interval (``guidance.cache``'s, traced)."""
    import jax.numpy as jnp

    assert guidance.cache is not None  # (the cache's traced settings: engine/program.guiding)
    interval = guidance.cache["interval"]
    distance = call_number(timesteps, index) - call_number(timesteps, start)
    return jnp.remainder(distance, jnp.asarray(interval, distance.dtype)) == 0


def call_inputs(conditioning: Conditioning, x, guidance: Guidance) -> tuple[bool, Any, Any]:
    """(whether classifier-free guidance runs, the UNet's input: ``x`` doubled where it does, FreeU's factors or
    None) -- as :func:`.unet.halves` makes them."""
    import jax.numpy as jnp

    guided = conditioning.context.shape[0] != x.shape[0]
    return guided, (jnp.concatenate([x] * 2) if guided else x), unet.reweighing(guidance)


def predictions(pipeline: Any, params: dict, conditioning: Conditioning, x, timestep, guidance: Guidance,
                deep: DeepCache, state: DeepCacheState, whole) -> tuple[unet.Predictions, DeepCacheState]:
    """:func:`.unet.halves`'s predictions under DeepCache, and the state after the call: ``whole`` (traced bool) runs
    every layer and keeps the branch's input, else the branch alone from the kept input."""
    import jax
    import jax.numpy as jnp

    guided, model_input, freeu = call_inputs(conditioning, x, guidance)

    def every_layer(_):
        out, kept = unet.deep_cached(pipeline, params, conditioning, model_input, timestep, deep, freeu)
        return out, DeepCacheState(kept.astype(state.kept.dtype), state.skipped)

    def branch_alone(_):
        out, _ = unet.deep_cached(pipeline, params, conditioning, model_input, timestep,
                                  deep._replace(cached=state.kept), freeu)
        return out, DeepCacheState(state.kept, state.skipped + 1)

    out, state = jax.lax.cond(whole, every_layer, branch_alone, None)
    if guided:
        return unet.Predictions(*jnp.split(out, 2, axis=0)), state
    return unet.Predictions(None, out), state


def initial_state(pipeline: Any, params: dict, conditioning: Conditioning, x, timestep, guidance: Guidance,
                  deep: DeepCache) -> DeepCacheState:
    """The state before the first call: the kept input zeros of its shape (found by tracing a whole call)."""
    import jax
    import jax.numpy as jnp

    _, model_input, freeu = call_inputs(conditioning, x, guidance)
    _, kept = jax.eval_shape(lambda: unet.deep_cached(pipeline, params, conditioning, model_input, timestep, deep,
                                                      freeu))
    return DeepCacheState(jnp.zeros(kept.shape, kept.dtype), jnp.int32(0))
