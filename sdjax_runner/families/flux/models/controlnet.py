"""FLUX.1's ControlNet: diffusers' ``FluxControlNetModel`` (InstantX's and Shakker-Labs' FLUX.1 ControlNets, their
published layout) in flax.linen, with diffusers' parameter names, so their PyTorch safetensors load through the
transformer's converter (families/flux/models/convert.py).

A copy of the transformer's first blocks (``num_layers`` double, ``num_single_layers`` single) that reads the
control image's packed latents too: ``x_embedder(latents) + controlnet_x_embedder(control latents)``. Each block's
image-token output goes through its zero-initialised ``controlnet_blocks_i`` / ``controlnet_single_blocks_i``
(Linear) and is scaled by the conditioning scale: the residuals the transformer adds after its blocks
(:class:`ControlNetResiduals`, ``FlaxFluxTransformer.__call__``'s ``controlnet``). A union model (``num_mode``:
InstantX's and Shakker-Labs' Union) reads which kind of control image it is given, its control mode, as one more
token before the text: ``controlnet_mode_embedder``'s row for the mode, its position that of the first text token.
XLabs' kind (``conditioning_embedding_channels``: XLabs-AI's FLUX.1 ControlNets as diffusers reads them) reads the
control image in pixels, not its latents: ``input_hint_block`` (the SD ControlNets' conditioning embedding, four
levels of 16 channels) brings it to the latents' size, cut in ``patch_size`` patches as the packed latents are; the
transformer then repeats its double-block residuals over its double blocks (``ControlNetResiduals.repeat``)."""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.console import one_line
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models.transformer import (
    check_rope,
    conditioning,
    rope_tables,
    stack_inputs,
    stack_modules,
)
from sdjax_runner.families.sd.models.controlnet import ControlNetConditioningEmbedding
from sdjax_runner.models.controlnet import ALLOWED, KEY, LoadedControlNet, folder, read_config
from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' FluxControlNetModel config.json (its __init__ arguments) and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
    "num_mode": None,
    "conditioning_embedding_channels": None,
}


class ControlNetResiduals(NamedTuple):
    """What a FLUX.1 ControlNet adds to the transformer: one residual per ControlNet block of each kind, scaled,
    ``(batch, image tokens, inner dim)`` each. The transformer's double block ``i`` adds ``double[i //
    ceil(num_layers / len(double))]``, its single block ``i`` ``single[i // ceil(num_single_layers / len(single))]``
    (diffusers' ``FluxTransformer2DModel.forward`` without ``controlnet_blocks_repeat``)."""

    double: tuple
    single: tuple
    # XLabs' kind (an input hint block): double block ``i`` reads ``double[i % len(double)]`` instead (diffusers'
    # ``controlnet_blocks_repeat``)
    repeat: bool = False


class FlaxFluxControlNet(FromDiffusersConfig, layers.Module):
    """diffusers' ``FluxControlNetModel``. ``__call__(hidden_states, controlnet_cond, conditioning_scale,
    encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids, guidance=None)`` is its ``forward``
    (``return_dict=False``, no control mode): the inputs as the transformer's (module docstring of
    :mod:`.transformer`), ``controlnet_cond`` the control image's packed latents ``(B, S, in_channels)``,
    ``conditioning_scale`` a scalar. Returns :class:`ControlNetResiduals`."""

    patch_size: int = 1
    in_channels: int = 64
    num_layers: int = 19
    num_single_layers: int = 38
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 4096
    pooled_projection_dim: int = 768
    guidance_embeds: bool = False
    axes_dims_rope: tuple[int, ...] = (16, 56, 56)
    num_mode: Optional[int] = None
    conditioning_embedding_channels: Optional[int] = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention_implementation: str = "dot_product"

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "FLUX ControlNet"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ("axes_dims_rope",)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def reads_pixels(self) -> bool:
        """Whether it reads the control image in pixels through its hint block (XLabs' kind), not its latents."""
        return self.conditioning_embedding_channels is not None

    def check(self) -> None:
        """ValueError for a config this module does not run: a hint block whose patches are not the packed latents'
        width; the rotary bands as the transformer's."""
        channels = self.conditioning_embedding_channels
        if channels is not None and channels * self.patch_size**2 != self.in_channels:
            raise ValueError(f"conditioning_embedding_channels {channels} in patches of {self.patch_size} make "
                             f"{channels * self.patch_size**2} channels, not in_channels {self.in_channels}")
        check_rope(self.axes_dims_rope, self.attention_head_dim)

    def setup(self) -> None:
        self.check()
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        dim = self.inner_dim
        (self.time_text_embed, self.context_embedder, self.x_embedder, self.transformer_blocks,
         self.single_transformer_blocks) = stack_modules(self)
        self.controlnet_x_embedder = layers.Dense(dim, **kw)
        self.controlnet_blocks = [layers.Dense(dim, **kw) for _ in range(self.num_layers)]
        self.controlnet_single_blocks = [layers.Dense(dim, **kw) for _ in range(self.num_single_layers)]
        if self.num_mode is not None:
            self.controlnet_mode_embedder = nn.Embed(self.num_mode, dim, dtype=self.dtype, param_dtype=self.param_dtype)
        if self.conditioning_embedding_channels is not None:  # (reads_pixels)
            self.input_hint_block = ControlNetConditioningEmbedding(self.conditioning_embedding_channels,
                                                                    (16, 16, 16, 16), dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array, controlnet_cond: jax.Array, conditioning_scale: Any,
                 encoder_hidden_states: jax.Array, pooled_projections: jax.Array, timestep: jax.Array,
                 img_ids: jax.Array, txt_ids: jax.Array, guidance: Optional[jax.Array] = None,
                 controlnet_mode: Optional[jax.Array] = None) -> ControlNetResiduals:
        if self.reads_pixels:
            controlnet_cond = self._hinted(controlnet_cond)
        x = self.x_embedder(hidden_states) + self.controlnet_x_embedder(controlnet_cond)
        temb, context = conditioning(self, encoder_hidden_states, pooled_projections, timestep, guidance)
        if self.num_mode is not None:  # the union's mode token before the text, at the first text token's position
            if controlnet_mode is None:
                raise ValueError("a union ControlNet needs its control mode")
            mode = jnp.broadcast_to(jnp.asarray(controlnet_mode, jnp.int32).reshape(-1, 1), (context.shape[0], 1))
            context = jnp.concatenate([self.controlnet_mode_embedder(mode).astype(context.dtype), context], axis=1)
            txt_ids = jnp.concatenate([txt_ids[:1], txt_ids], axis=0)
        rope = rope_tables(jnp.concatenate([txt_ids, img_ids], axis=0), tuple(self.axes_dims_rope))
        double, single = [], []
        for block in self.transformer_blocks:
            context, x = block(x, context, temb, rope)
            double.append(x)
        for single_block in self.single_transformer_blocks:
            context, x = single_block(x, context, temb, rope)
            single.append(x)
        scale = jnp.asarray(conditioning_scale)
        return ControlNetResiduals(
            tuple(project(sample) * scale.astype(sample.dtype)
                  for project, sample in zip(self.controlnet_blocks, double, strict=True)),
            tuple(project(sample) * scale.astype(sample.dtype)
                  for project, sample in zip(self.controlnet_single_blocks, single, strict=True)),
            repeat=self.reads_pixels)

    def _hinted(self, pixels: jax.Array) -> jax.Array:
        """The control image (NHWC, in [-1, 1]) through ``input_hint_block``, cut in ``patch_size`` patches as
        diffusers does: ``(B, tokens, channels * patch * patch)``, each token's features channel-major."""
        hint = self.input_hint_block(pixels)
        batch, height, width, channels = hint.shape
        patch = self.patch_size
        hint = hint.reshape(batch, height // patch, patch, width // patch, patch, channels)
        return hint.transpose(0, 1, 3, 5, 2, 4).reshape(batch, (height // patch) * (width // patch), -1)

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths (one image token, one text token): for initialisation."""
        cond = jnp.zeros((1, 8 * self.patch_size, 8 * self.patch_size, 3), self.dtype) if self.reads_pixels else \
            jnp.zeros((1, 1, self.in_channels), self.dtype)
        inputs = dict(stack_inputs(self), controlnet_cond=cond, conditioning_scale=1.0)
        if self.num_mode is not None:
            inputs["controlnet_mode"] = jnp.zeros((1,), jnp.int32)
        return inputs

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (the tree without the ``params`` collection key)."""
        return self.init(rng, **self.dummy_inputs())["params"]


# What a ControlNet shares with the transformer it steers: its inputs' widths, its heads and rotary bands
MUST_MATCH = ("in_channels", "joint_attention_dim", "pooled_projection_dim", "num_attention_heads",
              "attention_head_dim", "axes_dims_rope")


def load(value: str, cache_dir: str, transformer: Any, activations: Any, weights: np.dtype) -> LoadedControlNet:
    """The FLUX.1 ControlNet ``value`` (controlnet.model: a FluxControlNetModel folder -- PyTorch safetensors as
    diffusers saves them, or the runner's Flax file -- or ``tiny-random-flux-controlnet``) for ``transformer`` (the
    model's :class:`~.transformer.FlaxFluxTransformer`), its weights as host arrays (``weights`` dtype), computing
    in ``activations``; what it cannot run is one line on controlnet.model."""
    from sdjax_runner.families.flux.models.convert import convert_state_dict
    from sdjax_runner.families.flux.models.pipeline import FLAX_WEIGHTS, load_own

    started = time.perf_counter()
    path = folder(value, cache_dir)
    config = read_config(path, "FluxControlNetModel", "a FLUX.1 ControlNet")
    try:
        module = FlaxFluxControlNet.from_config(config, dtype=activations)
    except ValueError as exc:
        raise UserError(KEY, f"{path}: {one_line(exc)}", ALLOWED) from None
    different = [f"{key} {getattr(module, key)!r} (the transformer's {getattr(transformer, key)!r})"
                 for key in MUST_MATCH if tuple(np.ravel(getattr(module, key))) !=
                 tuple(np.ravel(getattr(transformer, key)))]
    if different:
        raise UserError(KEY, f"{path} was made for another FLUX.1 transformer: {', '.join(different)}", ALLOWED)

    def convert(state_dict: Any, net: Any, dtype: Any = None) -> dict:
        return convert_state_dict(state_dict, net, dtype, "the FLUX ControlNet's weights")

    try:
        module, params, files = load_own(path.parent, path.name, None, activations, weights,
                                         {path.name: (FlaxFluxControlNet.from_config, convert, "FluxControlNetModel")},
                                         "FLUX.1 ControlNet")
    except UserError as exc:  # said of a model's folder: here it is the ControlNet's
        raise UserError(KEY, exc.problem, exc.allowed or ALLOWED) from None
    structure = json.dumps(dict(module.config), sort_keys=True, default=str)
    return LoadedControlNet(module, params, str(path), "flax" if files[0].name == FLAX_WEIGHTS else "safetensors",
                            structure, time.perf_counter() - started, modes=module.num_mode)

