"""SD 3 / 3.5's ControlNet: diffusers' ``SD3ControlNetModel`` in flax.linen, with diffusers' parameter names, so the
published PyTorch safetensors (InstantX's SD3 ControlNets, Stability AI's SD 3.5 Large ControlNets as diffusers
converts them) load through the transformer's converter (families/flux/models/convert.py).

Two kinds, by the config:

* **joint blocks** (``joint_attention_dim`` set: InstantX's SD3-Controlnet-Canny/Pose/Tile, SD 3.5 Medium's kind):
  a copy of the transformer's first blocks -- its own ``pos_embed`` (patches plus sine-cosine positions),
  ``context_embedder`` and joint blocks (none of them ``context_pre_only``), reading the prompt;
* **single blocks** (``joint_attention_dim`` null, ``use_pos_embed`` false: Stability AI's SD 3.5 Large Canny,
  Depth and Blur): image-only blocks (diffusers' ``SD3SingleTransformerBlock``), no text; the latents arrive as the
  transformer's patch embedding makes them (diffusers' pipeline lends the ControlNet the transformer's
  ``pos_embed``; here the caller embeds them: :func:`embedded_by_transformer`).

Either way the control image's latents are added through ``pos_embed_input`` (a zero-initialised patch
projection, no positions), the timestep and pooled text are embedded as the transformer's, each block's output goes
through its zero-initialised ``controlnet_blocks_i`` (Linear) and is scaled by the conditioning scale: the residuals
the transformer adds after its blocks (``FlaxSD3Transformer.__call__``'s ``controlnet``). An inpainting ControlNet
(``extra_conditioning_channels`` 1: alimama-creative's SD3-Controlnet-Inpainting) reads the masked image's latents
and the mask as its control input (mode=controlnet_inpaint)."""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.console import one_line
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models.transformer import AdaLayerNormZero, FeedForward, TimeTextEmbedding, layer_norm
from sdjax_runner.families.sd3.models.transformer import CONFIG_DEFAULTS as TRANSFORMER_DEFAULTS
from sdjax_runner.families.sd3.models.transformer import JointAttention, JointTransformerBlock, PatchEmbed
from sdjax_runner.models.controlnet import ALLOWED, KEY, LoadedControlNet, folder, read_config
from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' SD3ControlNetModel config.json (its __init__ arguments) and their defaults there: the
# transformer's, with the same defaults, and these.
CONFIG_DEFAULTS: dict[str, Any] = {**TRANSFORMER_DEFAULTS, "extra_conditioning_channels": 0, "pos_embed_type": "sincos",
                                   "use_pos_embed": True, "force_zeros_for_pooled_projection": True}


class PatchProjection(layers.Module):
    """diffusers' ``PatchEmbed`` with ``pos_embed_type=None`` (the ControlNet's ``pos_embed_input``): ``proj``, a
    ``patch``-strided convolution of NHWC latents, flattened row-major to ``(B, h * w, dim)``; no positions."""

    dim: int
    patch_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, latents: jax.Array) -> jax.Array:
        patch = self.patch_size
        x = layers.Conv(self.dim, (patch, patch), strides=(patch, patch), padding="VALID", dtype=self.dtype,
                        param_dtype=self.param_dtype, name="proj")(latents)
        return x.reshape(x.shape[0], -1, x.shape[-1])


class SingleTransformerBlock(layers.Module):
    """diffusers' ``SD3SingleTransformerBlock`` (SD 3.5 Large's ControlNets): the image alone, modulated by ``norm1``
    (AdaLayerNormZero), its self-attention ``attn`` (no q/k norms) and feed-forward ``ff`` of ``LayerNorm(.) * (1 +
    scale_mlp) + shift_mlp``, each gated and added."""

    dim: int
    heads: int
    head_dim: int
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> jax.Array:
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        norm_x, gate_msa, shift_mlp, scale_mlp, gate_mlp = AdaLayerNormZero(self.dim, name="norm1", **kw)(x, temb)
        attention = JointAttention(self.heads, self.head_dim, qk_norm=False, implementation=self.implementation,
                                   name="attn", **kw)
        x = x + gate_msa[:, None] * attention(norm_x)
        norm_x = layer_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp[:, None] * FeedForward(self.dim, name="ff", **kw)(norm_x)


class FlaxSD3ControlNet(FromDiffusersConfig, layers.Module):
    """diffusers' ``SD3ControlNetModel``. ``__call__(hidden_states, controlnet_cond, conditioning_scale,
    encoder_hidden_states, pooled_projections, timestep)`` is its ``forward`` (``return_dict=False``) with NHWC
    latents: ``hidden_states`` ``(B, H, W, in_channels)`` -- or, without a ``pos_embed`` of its own
    (``use_pos_embed`` false), the transformer's patch embedding of them ``(B, h * w, dim)`` --, ``controlnet_cond``
    the control image's latents ``(B, H, W, in_channels)``, ``conditioning_scale`` a scalar,
    ``encoder_hidden_states`` the joint text states (None for single blocks), ``pooled_projections`` and
    ``timestep`` (0..1000) as the transformer's. Returns one residual ``(B, h * w, dim)`` per block."""

    sample_size: int = 128
    patch_size: int = 2
    in_channels: int = 16
    num_layers: int = 18
    attention_head_dim: int = 64
    num_attention_heads: int = 18
    joint_attention_dim: Optional[int] = 4096
    caption_projection_dim: int = 1152
    pooled_projection_dim: int = 2048
    out_channels: Optional[int] = 16
    pos_embed_max_size: Optional[int] = 96
    extra_conditioning_channels: int = 0
    dual_attention_layers: tuple[int, ...] = ()
    qk_norm: Optional[str] = None
    pos_embed_type: Optional[str] = "sincos"
    use_pos_embed: bool = True
    force_zeros_for_pooled_projection: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention_implementation: str = "dot_product"

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "SD3 ControlNet"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ("dual_attention_layers",)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def joint(self) -> bool:
        """Whether its blocks are joint (they read the prompt) rather than single (SD 3.5 Large's)."""
        return self.joint_attention_dim is not None

    def check(self) -> None:
        """ValueError for a config this module does not run: extra channels other than an inpainting one's, positions
        other than SD 3's sine-cosine table, q/k norms other than SD 3.5's."""
        if self.extra_conditioning_channels not in (0, 1):
            raise ValueError(f"extra_conditioning_channels {self.extra_conditioning_channels}: an inpainting "
                             "ControlNet reads one (the mask), an ordinary one none")
        if self.use_pos_embed and (self.pos_embed_type != "sincos" or not self.pos_embed_max_size):
            raise ValueError(f"pos_embed_type {self.pos_embed_type!r} with pos_embed_max_size "
                             f"{self.pos_embed_max_size!r}: SD 3's sine-cosine table with a size is what runs here")
        if self.qk_norm not in (None, "rms_norm"):
            raise ValueError(f"qk_norm {self.qk_norm!r} is not one SD 3 uses (allowed: null, rms_norm)")
        if self.joint and self.caption_projection_dim != self.inner_dim:
            raise ValueError(f"caption_projection_dim {self.caption_projection_dim} must equal the ControlNet's width "
                             f"{self.inner_dim} (heads x head dim)")
        if not self.joint and self.dual_attention_layers:
            raise ValueError("dual_attention_layers are joint blocks' (joint_attention_dim is null here)")

    def setup(self) -> None:
        self.check()
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        dim = self.inner_dim
        if self.use_pos_embed:
            assert self.pos_embed_max_size  # check's
            self.pos_embed = PatchEmbed(dim, self.patch_size, self.pos_embed_max_size,
                                        base_size=self.sample_size // self.patch_size, **kw)
        self.time_text_embed = TimeTextEmbedding(dim, guidance_embeds=False, **kw)
        self.transformer_blocks: list[Any]
        if self.joint:
            self.context_embedder = layers.Dense(self.caption_projection_dim, **kw)
            self.transformer_blocks = [
                JointTransformerBlock(dim, self.num_attention_heads, self.attention_head_dim, context_pre_only=False,
                                      qk_norm=self.qk_norm is not None, dual_attention=i in self.dual_attention_layers,
                                      implementation=self.attention_implementation, **kw)
                for i in range(self.num_layers)]
        else:
            self.transformer_blocks = [
                SingleTransformerBlock(dim, self.num_attention_heads, self.attention_head_dim,
                                       implementation=self.attention_implementation, **kw)
                for _ in range(self.num_layers)]
        self.controlnet_blocks = [layers.Dense(dim, **kw) for _ in range(self.num_layers)]
        self.pos_embed_input = PatchProjection(dim, self.patch_size, **kw)

    def __call__(self, hidden_states: jax.Array, controlnet_cond: jax.Array, conditioning_scale: Any,
                 encoder_hidden_states: Optional[jax.Array], pooled_projections: jax.Array,
                 timestep: jax.Array) -> tuple:
        x = self.pos_embed(hidden_states) if self.use_pos_embed else hidden_states
        temb = self.time_text_embed(jnp.asarray(timestep).astype(self.dtype), pooled_projections)
        x = x + self.pos_embed_input(controlnet_cond.astype(x.dtype))
        samples = []
        if self.joint:
            if encoder_hidden_states is None:
                raise ValueError("a ControlNet of joint blocks reads the prompt: pass encoder_hidden_states")
            context = self.context_embedder(encoder_hidden_states)
            for block in self.transformer_blocks:
                context, x = block(x, context, temb)
                samples.append(x)
        else:
            for single in self.transformer_blocks:
                x = single(x, temb)
                samples.append(x)
        scale = jnp.asarray(conditioning_scale)
        return tuple(project(sample) * scale.astype(sample.dtype)
                     for project, sample in zip(self.controlnet_blocks, samples, strict=True))

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths (one patch, one text token): for initialisation."""
        patch = (1, self.patch_size, self.patch_size, self.in_channels)
        hidden = jnp.zeros(patch, self.dtype) if self.use_pos_embed else jnp.zeros((1, 1, self.inner_dim), self.dtype)
        cond = (1, self.patch_size, self.patch_size, self.in_channels + self.extra_conditioning_channels)
        return {"hidden_states": hidden, "controlnet_cond": jnp.zeros(cond, self.dtype), "conditioning_scale": 1.0,
                "encoder_hidden_states": jnp.zeros((1, 1, self.joint_attention_dim), self.dtype) if self.joint else None,
                "pooled_projections": jnp.zeros((1, self.pooled_projection_dim), self.dtype),
                "timestep": jnp.zeros((1,), jnp.float32)}

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (``pos_embed`` the sine-cosine table; the tree without the ``params`` collection key)."""
        return self.init(rng, **self.dummy_inputs())["params"]


def embedded_by_transformer(transformer: Any, transformer_params: Any, latents: jax.Array) -> jax.Array:
    """NHWC ``latents`` through the transformer's ``pos_embed`` (patches and positions): what a ControlNet without
    a ``pos_embed`` of its own reads, as diffusers' StableDiffusion3ControlNetPipeline lends it the transformer's."""
    return transformer.apply({"params": transformer_params}, latents, method=lambda module, x: module.pos_embed(x))


def fits(module: FlaxSD3ControlNet, transformer: Any) -> list[str]:
    """What differs between what the ControlNet and the transformer it steers must share: the latents' channels
    and patches, the pooled text's width, the residuals' width (the transformer's), and the joint text's width
    where the ControlNet reads the prompt. Empty: it fits."""
    pairs: list[tuple[str, Any, Any]] = [("in_channels", module.in_channels, transformer.in_channels),
             ("patch_size", module.patch_size, transformer.patch_size),
             ("pooled_projection_dim", module.pooled_projection_dim, transformer.pooled_projection_dim),
             ("width (heads x head dim)", module.inner_dim, transformer.inner_dim)]
    if module.joint:
        pairs.append(("joint_attention_dim", module.joint_attention_dim, transformer.joint_attention_dim))
    return [f"{name} {mine} (the transformer's {theirs})" for name, mine, theirs in pairs if mine != theirs]


def load(value: str, cache_dir: str, transformer: Any, activations: Any, weights: np.dtype) -> LoadedControlNet:
    """The SD 3 ControlNet ``value`` (controlnet.model: an SD3ControlNetModel folder -- PyTorch safetensors as
    diffusers saves them, or the runner's Flax file -- or a built-in ``tiny-random-sd3-controlnet*``) for
    ``transformer`` (the model's :class:`~.transformer.FlaxSD3Transformer`), its weights as host arrays (``weights``
    dtype), computing in ``activations``; what it cannot run is one line on controlnet.model."""
    from sdjax_runner.families.flux.models.convert import convert_state_dict
    from sdjax_runner.families.flux.models.pipeline import FLAX_WEIGHTS, load_own

    started = time.perf_counter()
    path = folder(value, cache_dir)
    config = read_config(path, "SD3ControlNetModel", "an SD 3 ControlNet")
    try:
        module = FlaxSD3ControlNet.from_config(config, dtype=activations)
    except ValueError as exc:
        raise UserError(KEY, f"{path}: {one_line(exc)}", ALLOWED) from None
    different = fits(module, transformer)
    if different:
        raise UserError(KEY, f"{path} was made for another SD 3 transformer: {', '.join(different)}", ALLOWED)

    def convert(state_dict: Any, net: Any, dtype: Any = None) -> dict:
        return convert_state_dict(state_dict, net, dtype, "the SD 3 ControlNet's weights")

    try:
        module, params, files = load_own(path.parent, path.name, None, activations, weights,
                                         {path.name: (FlaxSD3ControlNet.from_config, convert, "SD3ControlNetModel")},
                                         "SD 3 ControlNet")
    except UserError as exc:  # said of a model's folder: here it is the ControlNet's
        raise UserError(KEY, exc.problem, exc.allowed or ALLOWED) from None
    structure = json.dumps(dict(module.config), sort_keys=True, default=str)
    return LoadedControlNet(module, params, str(path), "flax" if files[0].name == FLAX_WEIGHTS else "safetensors",
                            structure, time.perf_counter() - started, inpainting=bool(module.extra_conditioning_channels))
