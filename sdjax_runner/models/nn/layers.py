"""Flax's layers, with their parameters read without tracing their initialisers again.

linen's ``Module.param`` returns an existing parameter only after checking it against the parameter its
initialiser would make: a ``jax.eval_shape`` of the initialiser (a random normal, say: a few dozen operations
traced) for every parameter each time a module is applied under a trace. A UNet has about a thousand
parameters, so that check was about a third of the time it took to trace a program (0.45 s of 1.4 s for the
tiny SD model on a CPU; more for the full-size ones), paid again by every program a sampler, a mode or a size
makes. Here a parameter that exists is checked against the shape its layer declares (the initialiser's shape
argument), which is what linen's check compares, without tracing anything; the first use (``init``) and a
parameter declared without a shape go through linen's own ``param``. The values, the programs (the modules
lower to the same StableHLO: tests/test_sd_modules.py) and the error for a parameter of the wrong shape
(``ScopeParamShapeError``) are linen's.

Every module of the runner's own derives from :class:`Module` or uses the layers below, which are linen's
under the same class names (so automatic names such as ``Dense_0`` are unchanged)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import numpy as np
from flax.core import meta
from flax.errors import ScopeParamShapeError


def _declared_shape(init_args: tuple) -> tuple[int, ...] | None:
    """The shape a layer passes its initialiser (linen's layers: ``init_fn(key, shape, dtype)``; the norms give
    it as a list), if any."""
    if init_args and isinstance(init_args[0], (tuple, list)) and all(isinstance(n, (int, np.integer)) for n in init_args[0]):
        return tuple(int(n) for n in init_args[0])
    return None


class ReadsParams:
    """``param`` that returns an existing parameter after comparing its shape with the declared one."""

    @nn.nowrap
    def param(self, name: str, init_fn: Any, *init_args: Any, unbox: bool = True, **init_kwargs: Any) -> Any:
        shape = _declared_shape(init_args)
        scope = self.scope  # type: ignore[attr-defined]
        if shape is None or init_kwargs or scope is None or not scope.has_variable("params", name):
            return super().param(name, init_fn, *init_args, unbox=unbox, **init_kwargs)  # type: ignore[misc]
        scope.reserve(name, "params")  # a name used twice fails as in linen
        value = scope.get_variable("params", name)
        if unbox:
            value = meta.unbox(value)
        if np.shape(value) != shape:
            raise ScopeParamShapeError(name, scope.path_text, np.shape(value), shape)
        return value


class Module(ReadsParams, nn.Module):
    """linen's Module, its parameters read as above."""


class Dense(ReadsParams, nn.Dense):
    pass


class Conv(ReadsParams, nn.Conv):
    pass


class GroupNorm(ReadsParams, nn.GroupNorm):
    pass


class LayerNorm(ReadsParams, nn.LayerNorm):
    pass


class RMSNorm(ReadsParams, nn.RMSNorm):
    pass


class Embed(ReadsParams, nn.Embed):
    pass
