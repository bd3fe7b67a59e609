"""Stable Diffusion 3 / 3.5's transformer (the MMDiT) in flax.linen: the JAX twin of diffusers 0.39's PyTorch
``SD3Transformer2DModel`` (``diffusers/models/transformers/transformer_sd3.py``), number for number.

The Flax parameter tree is diffusers' state-dict names with ``.N`` written ``_N``
(``transformer_blocks.0.attn.to_q.weight`` -> ``transformer_blocks_0/attn/to_q/kernel``), so FLUX.1's generic
PyTorch -> Flax conversion (families/flux/models/convert.py) reads its weights. What the forward does, as diffusers does:

* ``pos_embed``: a ``patch_size``-strided convolution of the latents (``proj``) plus 2-D sine-cosine position
  embeddings cropped from the centre of a ``pos_embed_max_size`` square table (``pos_embed``, a saved buffer in
  diffusers' files: a parameter here, made by :func:`sincos_table` at initialisation);
* ``time_text_embed``: the sinusoidal timestep embedding through a SiLU MLP plus a SiLU MLP of the pooled
  CLIP-L + CLIP-G embedding (FLUX.1-schnell's embedding, the same module); ``context_embedder``: a Linear of the
  joint text states (CLIP features padded to the T5 width, then T5's states);
* ``num_layers`` joint blocks: image and text each modulated (AdaLayerNormZero; SD 3.5's first
  ``dual_attention_layers`` blocks modulate the image twice, SD35AdaLayerNormZeroX, for a second, image-only
  attention ``attn2``) attend jointly as ``[image; text]``; the last block updates the image only
  (``context_pre_only``: its text is only read);
* ``norm_out`` (AdaLayerNormContinuous), ``proj_out`` and the patches folded back into latents.

SD 3.5 normalises queries and keys per head (``qk_norm="rms_norm"``); SD 3.0 does not (``qk_norm=None``).
``skip_layers`` skips blocks, as diffusers' skip-layer guidance does; ``perturbed`` runs the self-attention
modules perturbed-attention guidance picks perturbed for the batch's last chunk (:func:`perturbed_attention`).
Latents are NHWC here (diffusers: NCHW).
Numerics follow families/flux/models/transformer.py: norms, the softmax and the sinusoids in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.families.flux.models.transformer import (
    AdaLayerNormContinuous,
    AdaLayerNormZero,
    FeedForward,
    RMSNorm,
    TimeTextEmbedding,
    layer_norm,
)
from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.attention import attend
from sdjax_runner.models.nn.config import FromDiffusersConfig
from sdjax_runner.models.nn.perturbed import Perturbed, blurred_queries, perturbs, torch_name

# A block's self-attention modules: its joint attention and SD 3.5 Medium's image-only second one (PAG's layers pick
# among them by their PyTorch names, transformer_blocks.N.attn)
SELF_ATTENTION = ("attn", "attn2")
# The keys of diffusers' SD3Transformer2DModel config.json (its __init__ arguments) and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 18,
    "attention_head_dim": 64,
    "num_attention_heads": 18,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1152,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 96,
    "dual_attention_layers": (),
    "qk_norm": None,
}


def sincos_table(dim: int, grid_size: int, base_size: int, interpolation_scale: float = 1.0) -> np.ndarray:
    """diffusers' ``get_2d_sincos_pos_embed(dim, grid_size, base_size=base_size, interpolation_scale)``, float32
    ``(grid_size**2, dim)``: positions ``arange(grid) / (grid / base_size) / scale`` (float32, as torch makes
    them), row-major over (h, w); the first half of the features encodes w, the second h -- each ``[sin(p *
    w_k), cos(p * w_k)]`` with ``w_k = 10000 ** (-k / (dim / 4))`` in float64, as diffusers computes them."""
    if dim % 4:
        raise ValueError(f"the position embedding width must be a multiple of 4, got {dim}")
    positions = np.arange(grid_size, dtype=np.float32) / np.float32(grid_size / base_size) / np.float32(
        interpolation_scale)
    grid_w, grid_h = np.meshgrid(positions, positions, indexing="xy")  # w varies along the row

    def one_axis(pos: np.ndarray) -> np.ndarray:
        omega = np.arange(dim // 4, dtype=np.float64) / (dim / 4.0)
        omega = 1.0 / 10000**omega
        out = np.outer(pos.reshape(-1).astype(np.float64), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([one_axis(grid_w), one_axis(grid_h)], axis=1).astype(np.float32)


class PatchEmbed(layers.Module):
    """diffusers' ``PatchEmbed`` as SD 3 builds it (``layer_norm=False``, ``flatten=True``, sincos positions with
    ``pos_embed_max_size``): ``proj`` (Conv, kernel = stride = patch) of NHWC latents to ``(B, h * w, dim)``, plus
    the centre crop of the position table (``pos_embed``, ``(1, max**2, dim)``)."""

    dim: int
    patch_size: int
    pos_embed_max_size: int
    base_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, latents: jax.Array) -> jax.Array:
        patch, size = self.patch_size, self.pos_embed_max_size
        x = layers.Conv(self.dim, (patch, patch), strides=(patch, patch), padding="VALID", dtype=self.dtype,
                    param_dtype=self.param_dtype, name="proj")(latents)
        batch, height, width, _ = x.shape
        if height > size or width > size:
            raise ValueError(f"latents of {height * patch}x{width * patch} are larger than the position table "
                             f"({size * patch}x{size * patch}, pos_embed_max_size={size})")
        table = self.param("pos_embed", lambda _: jnp.asarray(
            sincos_table(self.dim, size, self.base_size))[None].astype(self.param_dtype))
        top, left = (size - height) // 2, (size - width) // 2
        crop = table.reshape(size, size, -1)[top:top + height, left:left + width].reshape(1, height * width, -1)
        return (x.reshape(batch, height * width, -1) + crop).astype(x.dtype)


class AdaLayerNormZeroX(layers.Module):
    """diffusers' ``SD35AdaLayerNormZeroX(dim)`` (SD 3.5's dual-attention blocks' ``norm1``): ``linear(silu(temb))``
    split in nine -- shift, scale, gate for the attention, for the MLP, and for the second attention -- and one
    LayerNorm modulated twice. Returns ``(x, gate_msa, shift_mlp, scale_mlp, gate_mlp, x2, gate_msa2)``."""

    dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> tuple[jax.Array, ...]:
        emb = layers.Dense(9 * self.dim, dtype=self.dtype, param_dtype=self.param_dtype, name="linear")(nn.silu(temb))
        (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp, shift_msa2, scale_msa2,
         gate_msa2) = jnp.split(emb, 9, axis=-1)
        normed = layer_norm(x)
        return (normed * (1 + scale_msa[:, None]) + shift_msa[:, None], gate_msa, shift_mlp, scale_mlp, gate_mlp,
                normed * (1 + scale_msa2[:, None]) + shift_msa2[:, None], gate_msa2)


class JointAttention(layers.Module):
    """diffusers' ``Attention`` with ``JointAttnProcessor2_0``: ``to_q/k/v`` of the image (with bias), per-head
    RMS norms when ``qk_norm`` (SD 3.5), and -- given a ``context`` -- its own ``add_q/k/v_proj`` (and
    ``norm_added_q/k``); the sequences attend as ``[x; context]`` (image first, unlike FLUX.1) and are split
    again, the image part through ``to_out_0``, the text part through ``to_add_out`` unless ``context_pre_only``
    (the last block: its text output is not used, and diffusers makes no ``to_add_out``). Returns ``x`` or ``(x,
    context)``."""

    heads: int
    head_dim: int
    qk_norm: bool
    context_pre_only: bool = False
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def _dense(self, features: int, name: str) -> layers.Dense:
        return layers.Dense(features, dtype=self.dtype, param_dtype=self.param_dtype, name=name)

    def _project(self, x: jax.Array, name: str, norm: Optional[str],
                 projected: Optional[Callable[[jax.Array], jax.Array]] = None) -> jax.Array:
        """``x`` through the Dense ``name`` (then ``projected``, where given), in heads, through the RMS norm ``norm``
        where the model has q/k norms."""
        out = self._dense(self.heads * self.head_dim, name)(x)
        heads = (projected(out) if projected else out).reshape(*x.shape[:-1], self.heads, self.head_dim)
        if norm and self.qk_norm:
            heads = RMSNorm(eps=1e-6, dtype=self.dtype, param_dtype=self.param_dtype, name=norm)(heads)
        return heads

    @nn.compact
    def __call__(self, x: jax.Array, context: Optional[jax.Array] = None, perturbed_chunks: int = 0,
                 query_blur: Any = None, grid: tuple[int, ...] = ()) -> Any:
        """``perturbed_chunks`` n > 0: the batch is n equal chunks, and the last attends perturbed -- with
        ``query_blur`` None as PAG perturbs (:func:`perturbed_attention`), else (SEG's traced sigma) with its image
        queries blurred over the image's ``grid`` of patches (models/nn/perturbed.py), as diffusers' SEG hook blurs
        ``to_q``'s output, before the q norm."""
        rows = x.shape[0] // perturbed_chunks if perturbed_chunks else 0
        blurred = None
        if rows and query_blur is not None:
            def blurred(queries: jax.Array) -> jax.Array:
                return jnp.concatenate([queries[:-rows], blurred_queries(queries[-rows:], grid[0], grid[1], query_blur)])
        query, key, value = (self._project(x, "to_q", "norm_q", blurred), self._project(x, "to_k", "norm_k"),
                             self._project(x, "to_v", None))
        if context is not None:
            query = jnp.concatenate([query, self._project(context, "add_q_proj", "norm_added_q")], axis=1)
            key = jnp.concatenate([key, self._project(context, "add_k_proj", "norm_added_k")], axis=1)
            value = jnp.concatenate([value, self._project(context, "add_v_proj", None)], axis=1)
        if rows and blurred is None:
            out = jnp.concatenate([attend(query[:-rows], key[:-rows], value[:-rows], self.implementation),
                                   perturbed_attention(query[-rows:], key[-rows:], value[-rows:], x.shape[1])])
        else:
            out = attend(query, key, value, self.implementation)
        out = out.reshape(*out.shape[:2], self.heads * self.head_dim).astype(query.dtype)
        image = x.shape[1]
        x_out = self._dense(x.shape[-1], "to_out_0")(out[:, :image])
        if context is None:
            return x_out
        if self.context_pre_only:
            return x_out, None
        return x_out, self._dense(context.shape[-1], "to_add_out")(out[:, image:])


def perturbed_attention(query: jax.Array, key: jax.Array, value: jax.Array, image_tokens: int) -> jax.Array:
    """Perturbed-attention guidance's attention on ``(batch, tokens, heads, head_dim)`` heads whose first
    ``image_tokens`` are the image's: among the image tokens each sees itself alone, and the text tokens (a joint
    attention's) see and are seen as usual -- diffusers' ``PAGCFGJointAttnProcessor2_0`` and
    ``PAGJointAttnProcessor2_0`` (their mask: -inf between image tokens but on the diagonal). Without text tokens
    (SD 3.5 Medium's image-only ``attn2``) that is the identity: each token its own value, as the UNet's
    perturbed self-attention (diffusers' joint processor cannot run there)."""
    tokens = key.shape[1]
    if tokens == image_tokens:
        return value
    image = jnp.arange(tokens) < image_tokens
    allowed = ~(image[:, None] & image[None, :]) | jnp.eye(tokens, dtype=bool)
    return jax.nn.dot_product_attention(query, key, value, mask=allowed[None, None],
                                        scale=1 / float(np.sqrt(query.shape[-1])))


class JointTransformerBlock(layers.Module):
    """diffusers' ``JointTransformerBlock``: the image ``x`` modulated by ``norm1`` (AdaLayerNormZero, or
    SD35AdaLayerNormZeroX with ``dual_attention``), the text ``context`` by ``norm1_context`` (AdaLayerNormZero, or
    AdaLayerNormContinuous in the ``context_pre_only`` last block); joint attention ``attn``; with
    ``dual_attention`` an image-only ``attn2`` of the second modulation; each stream adds its gated attention and
    its gated feed-forward (``ff``, ``ff_context``) of ``LayerNorm(.) * (1 + scale_mlp) + shift_mlp``. Returns
    ``(context, x)`` (context None after the last block), as diffusers does."""

    dim: int
    heads: int
    head_dim: int
    context_pre_only: bool
    qk_norm: bool
    dual_attention: bool
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array, temb: jax.Array, perturbed_chunks: tuple[int, int] = (0, 0),
                 query_blur: Any = None, grid: tuple[int, ...] = ()) -> tuple[Optional[jax.Array], jax.Array]:
        """``perturbed_chunks``: :class:`JointAttention`'s for ``attn`` and for ``attn2``; ``query_blur`` and ``grid``:
        theirs (SEG)."""
        perturbation = dict(query_blur=query_blur, grid=grid)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        if self.dual_attention:
            norm_x, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_x2, gate_msa2 = AdaLayerNormZeroX(
                self.dim, name="norm1", **kw)(x, temb)
        else:
            norm_x, gate_msa, shift_mlp, scale_mlp, gate_mlp = AdaLayerNormZero(self.dim, name="norm1", **kw)(x, temb)
        if self.context_pre_only:
            norm_c = AdaLayerNormContinuous(self.dim, name="norm1_context", **kw)(context, temb)
        else:
            norm_c, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = AdaLayerNormZero(
                self.dim, name="norm1_context", **kw)(context, temb)
        attention = dict(qk_norm=self.qk_norm, implementation=self.implementation, **kw)
        attn_x, attn_c = JointAttention(self.heads, self.head_dim, context_pre_only=self.context_pre_only,
                                        name="attn", **attention)(norm_x, norm_c, perturbed_chunks[0], **perturbation)
        x = x + gate_msa[:, None] * attn_x
        if self.dual_attention:
            x = x + gate_msa2[:, None] * JointAttention(self.heads, self.head_dim, name="attn2", **attention)(
                norm_x2, None, perturbed_chunks[1], **perturbation)
        norm_x = layer_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        x = x + gate_mlp[:, None] * FeedForward(self.dim, name="ff", **kw)(norm_x)
        if self.context_pre_only:
            return None, x
        context = context + c_gate_msa[:, None] * attn_c
        norm_c = layer_norm(context) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        context = context + c_gate_mlp[:, None] * FeedForward(self.dim, name="ff_context", **kw)(norm_c)
        return context, x


class FlaxSD3Transformer(FromDiffusersConfig, layers.Module):
    """SD 3 / 3.5's transformer: diffusers' ``SD3Transformer2DModel`` in flax.linen. The fields up to ``qk_norm``
    are diffusers' config.json keys (build it from a config with :meth:`from_config`); ``dtype`` is the
    activations' dtype, ``param_dtype`` the parameters' at initialisation.

    ``__call__(hidden_states, encoder_hidden_states, pooled_projections, timestep, skip_layers=())`` is diffusers'
    ``forward`` (``return_dict=False``, no IP-Adapter; ``controlnet``: a ControlNet's residuals,
    ``block_controlnet_hidden_states``) on NHWC latents: ``hidden_states``
    ``(B, H, W, in_channels)``, ``encoder_hidden_states`` ``(B, T, joint_attention_dim)``, ``pooled_projections``
    ``(B, pooled_projection_dim)``, ``timestep`` ``(B,)`` on the scheduler's 0..1000 scale. Returns ``(B, H, W,
    out_channels)``."""

    sample_size: int = 128
    patch_size: int = 2
    in_channels: int = 16
    num_layers: int = 18
    attention_head_dim: int = 64
    num_attention_heads: int = 18
    joint_attention_dim: int = 4096
    caption_projection_dim: int = 1152
    pooled_projection_dim: int = 2048
    out_channels: Optional[int] = 16
    pos_embed_max_size: int = 96
    dual_attention_layers: tuple[int, ...] = ()
    qk_norm: Optional[str] = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention_implementation: str = "dot_product"
    # Weights split across devices (parallelism.params=sharded, engine/sharded.py): (block number, the block's
    # params as this device holds them) -> the block's whole params. None: the weights arrive whole. Either way
    # each block's params pass an optimization barrier with the previous block's output before use, so one
    # block's weights are whole at a time (as FLUX.1's transformer does).
    gather_blocks: Optional[Callable[[int, Any], Any]] = None

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "SD3 transformer"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ("dual_attention_layers",)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    def check(self) -> None:
        """ValueError for a config this module cannot run."""
        if self.qk_norm not in (None, "rms_norm"):
            raise ValueError(f"qk_norm {self.qk_norm!r} is not one SD 3 uses (allowed: null, rms_norm)")
        if self.caption_projection_dim != self.inner_dim:
            raise ValueError(f"caption_projection_dim {self.caption_projection_dim} must equal the transformer's width "
                             f"{self.inner_dim} (heads x head dim), as in every published SD 3 model")
        if any(not 0 <= i < self.num_layers for i in self.dual_attention_layers):
            raise ValueError(f"dual_attention_layers {tuple(self.dual_attention_layers)} must be block numbers "
                             f"below num_layers {self.num_layers}")

    def setup(self) -> None:
        self.check()
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        dim = self.inner_dim
        self.pos_embed = PatchEmbed(dim, self.patch_size, self.pos_embed_max_size,
                                    base_size=self.sample_size // self.patch_size, **kw)
        self.time_text_embed = TimeTextEmbedding(dim, guidance_embeds=False, **kw)
        self.context_embedder = layers.Dense(self.caption_projection_dim, **kw)
        self.transformer_blocks = [
            JointTransformerBlock(dim, self.num_attention_heads, self.attention_head_dim,
                                  context_pre_only=i == self.num_layers - 1, qk_norm=self.qk_norm is not None,
                                  dual_attention=i in self.dual_attention_layers,
                                  implementation=self.attention_implementation, **kw)
            for i in range(self.num_layers)]
        self.norm_out = AdaLayerNormContinuous(dim, **kw)
        self.proj_out = layers.Dense(self.patch_size * self.patch_size * (self.out_channels or self.in_channels), **kw)

    def __call__(self, hidden_states: jax.Array, encoder_hidden_states: jax.Array, pooled_projections: jax.Array,
                 timestep: jax.Array, skip_layers: Sequence[int] = (), perturbed: Optional[Perturbed] = None,
                 around_blocks: Optional[Callable] = None, controlnet: Optional[Sequence[jax.Array]] = None) -> Any:
        """The prediction (``controlnet``: an SD 3 ControlNet's residuals, families/sd3/models/controlnet.py, added
        after the blocks as :meth:`_blocks` says); with ``around_blocks`` -- a step cache (models/nn/step_cache.py): ``(head, rest, x,
        context) -> (context, x, what the cache returns)``, ``head`` running the first block and ``rest`` the others
        -- ``(prediction, what the cache returned)``. The last block makes no text output (``context_pre_only``):
        ``rest`` gives zeros for it, which nothing reads."""
        batch, height, width, _ = hidden_states.shape
        grid = (height // self.patch_size, width // self.patch_size)  # the image tokens' (SEG blurs over it)
        x = self.pos_embed(hidden_states)
        temb = self.time_text_embed(jnp.asarray(timestep).astype(self.dtype), pooled_projections)
        context: Optional[jax.Array] = self.context_embedder(encoder_hidden_states)
        if self.is_initializing():  # the blocks' params are made here
            for block in self.transformer_blocks:
                assert context is not None
                context, x = block(x, context, temb)
        elif around_blocks is not None:
            def rest(x: jax.Array, context: jax.Array) -> tuple[jax.Array, jax.Array]:
                out_context, out_x = self._blocks(x, context, temb, skip_layers, perturbed, grid, first=1)
                return (jnp.zeros_like(context) if out_context is None else out_context), out_x

            _, x, cached = around_blocks(
                lambda x, context: self._blocks(x, context, temb, skip_layers, perturbed, grid, last=1), rest, x, context)
            return self._unpatched(self.proj_out(self.norm_out(x, temb)), batch, height, width), cached
        else:
            x = self._blocks(x, context, temb, skip_layers, perturbed, grid, controlnet=controlnet)[1]
        return self._unpatched(self.proj_out(self.norm_out(x, temb)), batch, height, width)

    def _unpatched(self, x: jax.Array, batch: int, height: int, width: int) -> jax.Array:
        """The output tokens folded back into ``(batch, height, width, out_channels)`` latents."""
        patch, out_channels = self.patch_size, self.out_channels or self.in_channels
        x = x.reshape(batch, height // patch, width // patch, patch, patch, out_channels)
        return x.transpose(0, 1, 3, 2, 4, 5).reshape(batch, height, width, out_channels)

    def _blocks(self, x: jax.Array, context: Optional[jax.Array], temb: jax.Array, skip_layers: Sequence[int],
                perturbed: Optional[Perturbed] = None, grid: tuple[int, ...] = (), first: int = 0,
                last: Optional[int] = None, controlnet: Optional[Sequence[jax.Array]] = None
                ) -> tuple[Optional[jax.Array], jax.Array]:
        """Blocks ``first`` to ``last`` (exclusive; None: to the end) not in ``skip_layers``, in order, each a pure
        function of its params: block i's params pass an optimization barrier with the previous block's output, then
        ``gather_blocks`` makes them whole (weights split across devices) -- so XLA cannot gather every block's
        weights at once. ``perturbed``: the attention modules it picks run its last chunk perturbed (SEG: blurred over the
        image's ``grid`` of patches). ``controlnet``: after each block but the last (``context_pre_only``), the
        image adds residual ``int(i / (num_layers / len(controlnet)))`` -- diffusers' ``interval_control``, float
        division as there. Returns ``(context, x)`` (context None after the last block)."""
        params = self.variables["params"]
        gather = self.gather_blocks or (lambda number, block: block)
        for i, block in enumerate(self.transformer_blocks):
            if i in skip_layers or i < first or (last is not None and i >= last):
                continue
            shards, x, context = jax.lax.optimization_barrier((params[f"transformer_blocks_{i}"], x, context))
            detached = block.clone(parent=None)  # a pure function of its params
            assert context is not None
            chunks = tuple(perturbed.chunks if perturbed and perturbs(perturbed.layers,
                                                                      torch_name((f"transformer_blocks_{i}", name)))
                           else 0 for name in SELF_ATTENTION)
            out: Any = detached.apply({"params": gather(i, shards)}, x, context, temb, chunks,
                                      perturbed.blur_sigma if perturbed else None, grid)
            context, x = out
            if controlnet is not None and i < self.num_layers - 1:
                x = x + controlnet[int(i / (self.num_layers / len(controlnet)))].astype(x.dtype)
        return context, x

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths (one patch, one text token): for initialisation."""
        return {"hidden_states": jnp.zeros((1, self.patch_size, self.patch_size, self.in_channels), self.dtype),
                "encoder_hidden_states": jnp.zeros((1, 1, self.joint_attention_dim), self.dtype),
                "pooled_projections": jnp.zeros((1, self.pooled_projection_dim), self.dtype),
                "timestep": jnp.zeros((1,), jnp.float32)}

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (``pos_embed`` the sine-cosine table); ``jax.eval_shape`` gives the shapes."""
        return self.init(rng, **self.dummy_inputs())["params"]


def self_attention_names(params: Any) -> list[str]:
    """The PyTorch names of the self-attention modules of a transformer's parameter tree: each block's joint
    ``attn`` and SD 3.5 Medium's image-only ``attn2`` (``transformer_blocks.0.attn``, ...), as diffusers' PAG
    pipelines name them."""
    return [torch_name((block, name)) for block, tree in params.items() if block.startswith("transformer_blocks_")
            for name in SELF_ATTENTION if name in tree]
