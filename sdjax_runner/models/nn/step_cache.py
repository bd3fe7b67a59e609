"""Step caches inside a model's call (config/caches.py names them), for any family whose transformer runs its
blocks in order: First-Block Cache as diffusers' ``FirstBlockCacheConfig`` hooks run it
(diffusers/hooks/first_block_cache.py), in JAX, the skip decided on the device with ``lax.cond``.

The first ("head") block always runs. Its residual -- its image-token output minus its input -- is compared with
the residual of the last call that ran every block: the mean absolute difference relative to that residual's mean
absolute value. Over the threshold (or on the first call, where there is no earlier residual: the relative change
is infinite), the other blocks run, and the call keeps its head residual and what the other blocks added to the
head's outputs (the "tail residuals", image and text tokens). Otherwise the other blocks are skipped: the head's
outputs plus the kept tail residuals stand for their outputs, and the kept head residual stays the one compared
with (diffusers updates it only on a call that runs every block)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class FirstBlockState(NamedTuple):
    """What First-Block Cache carries from one call to the next (zeros before the first call)."""

    residual: Any  # the head block's image residual at the last call that ran every block
    tail: Any  # what the other blocks added to the head's image output then
    tail_context: Any  # ... and to its text output


def first_block_state(x_shape: tuple, context_shape: tuple, dtype: Any) -> FirstBlockState:
    """The state before the first call: every residual zero, so the first call runs every block."""
    return FirstBlockState(jnp.zeros(x_shape, dtype), jnp.zeros(x_shape, dtype), jnp.zeros(context_shape, dtype))


def relative_change(residual, previous):
    """diffusers' ``(residual - previous).abs().mean() / previous.abs().mean()``, in float32."""
    residual, previous = residual.astype(jnp.float32), previous.astype(jnp.float32)
    return jnp.mean(jnp.abs(residual - previous)) / jnp.mean(jnp.abs(previous))


def first_block_call(head: Callable, rest: Callable, x, context, state: FirstBlockState, threshold):
    """One model call's blocks under First-Block Cache: ``head(x, context)`` and ``rest(x, context)`` each return
    ``(context, x)`` (the blocks' output convention); returns ``(context, x, new state, skipped)``, ``skipped`` 1
    where the other blocks did not run (int32)."""
    head_context, head_x = head(x, context)
    residual = head_x - x
    # A change over the threshold runs every block; so does a change that is not a number (no earlier residual).
    runs = jnp.logical_not(relative_change(residual, state.residual) <= threshold)

    def every_block(_):
        out_context, out_x = rest(head_x, head_context)
        kept = FirstBlockState(residual, out_x - head_x, out_context - head_context)
        return out_context, out_x, kept, jnp.int32(0)

    def head_only(_):
        return head_context + state.tail_context, head_x + state.tail, state, jnp.int32(1)

    return jax.lax.cond(runs, every_block, head_only, None)


def first_block_steps(threshold) -> Callable:
    """Each step's call under First-Block Cache, for a sampler that carries the state: ``around(index, state)`` is
    the transformer's ``around_blocks``, returning ``(context, x, (state after the call, skipped))``."""

    def around(index, state):
        def blocks(head, rest, x, context):
            out_context, out_x, state_after, skipped = first_block_call(head, rest, x, context, state, threshold)
            return out_context, out_x, (state_after, skipped)

        return blocks

    return around


# -- MagCache ----------------------------------------------------------------------------------------------------------


class MagState(NamedTuple):
    """What MagCache carries from one call to the next (diffusers' MagCacheState; :func:`mag_state` before the first)."""

    residual: Any  # the whole stack's image residual (last block's output minus first block's input), last full call
    primed: Any  # bool: a full call has run (diffusers: previous_residual is not None)
    ratio: Any  # float32: the accumulated magnitude ratio since the last full call
    error: Any  # float32: the accumulated error
    steps: Any  # int32: the calls accumulated


def mag_state(x_shape: tuple, dtype: Any) -> MagState:
    return MagState(jnp.zeros(x_shape, dtype), jnp.bool_(False), jnp.float32(1.0), jnp.float32(0.0), jnp.int32(0))


def mag_ratios(published, steps: int):
    """diffusers' ``nearest_interp``: a model's published magnitude ratios (one per step of its calibration run)
    at ``steps`` steps, the nearest ratio for each (NumPy's round, half to even, as torch.round)."""
    import numpy as np

    published = np.asarray(published, np.float32)
    if steps == 1:
        return published[-1:]
    scale = (len(published) - 1) / (steps - 1)
    return published[np.round(np.arange(steps, dtype=np.float32) * np.float32(scale)).astype(np.int64)]


def mag_cache_call(blocks: Callable, x, context, state: MagState, step, ratio, threshold, max_skip_steps,
                   retention_step):
    """One model call's blocks under MagCache (diffusers' MagCacheHeadHook and MagCacheBlockHook,
    diffusers/hooks/mag_cache.py): from step ``retention_step`` on (diffusers' ``int(retention_ratio * steps +
    0.5)``) the step's ``ratio`` multiplies the accumulated ratio and ``|1 - accumulated ratio|`` adds to the
    accumulated error; where a full call has run, the error is at most ``threshold`` and at most ``max_skip_steps``
    calls have accumulated, the blocks are skipped and the first block's input plus the kept residual stands for the
    last block's output (the text tokens pass as they came). Otherwise the blocks run, the accumulators restart
    (from the retention step on) and the call keeps its residual. ``blocks(x, context)`` runs every block, returning
    ``(context, x)``; returns ``(context, x, new state, skipped)``."""
    counting = step >= retention_step
    ratio_now = state.ratio * ratio
    steps_now = state.steps + 1
    error_now = state.error + jnp.abs(1.0 - ratio_now)
    skips = counting & state.primed & (error_now <= threshold) & (steps_now <= max_skip_steps)
    restart = counting & jnp.logical_not(skips)
    kept = (jnp.where(restart, 1.0, jnp.where(counting, ratio_now, state.ratio)).astype(jnp.float32),
            jnp.where(restart, 0.0, jnp.where(counting, error_now, state.error)).astype(jnp.float32),
            jnp.where(restart, 0, jnp.where(counting, steps_now, state.steps)).astype(jnp.int32))

    def every_block(_):
        out_context, out_x = blocks(x, context)
        return out_context, out_x, out_x - x, jnp.int32(0)

    def reused(_):
        return context, x + state.residual, state.residual, jnp.int32(1)

    out_context, out_x, residual, skipped = jax.lax.cond(skips, reused, every_block, None)
    return out_context, out_x, MagState(residual, jnp.bool_(True), *kept), skipped
