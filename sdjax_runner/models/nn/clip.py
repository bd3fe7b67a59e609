"""CLIP in flax.linen: the text encoders of SD 1.x (CLIP-L, ``quick_gelu``), SD 2.x (OpenCLIP-H, ``gelu``), SDXL
(CLIP-L plus OpenCLIP-bigG with its projection), FLUX.1 and SD 3, the full CLIP model (text and vision towers,
their projections) the CLIP score uses, and CLIP's image preprocessing.

The JAX twin of transformers 4.57's Flax CLIP (``models/clip/modeling_flax_clip.py``, no longer in transformers 5)
and of its ``CLIPImageProcessor``: the same flax layers with the same arguments, in the same order, with the same
casts, so on the same weights every output is bit-for-bit transformers' (CPU, float32, under ``jax.jit``). The
parameter trees are transformers' Flax ones, so its ``flax_model.msgpack`` folders and PyTorch weights converted
with its renaming load unchanged:

* :class:`CLIPTextModel`: ``text_model/{embeddings,encoder/layers/N,final_layer_norm}/...`` (``FlaxCLIPTextModel``)
  plus ``text_projection/kernel`` with ``with_projection`` (``FlaxCLIPTextModelWithProjection``);
* :class:`CLIPVisionModel`: ``vision_model/{embeddings,pre_layrnorm,encoder/layers/N,post_layernorm}/...``
  (``FlaxCLIPVisionModel``);
* :class:`CLIPModel`: ``text_model``, ``vision_model``, ``text_projection``, ``visual_projection`` and
  ``logit_scale`` (``FlaxCLIPModel``).

What the text tower computes: token plus position embeddings; pre-norm transformer layers with causal attention
(and the attention mask's zeros masked: a bias of the dtype's most negative value where either mask is 0); the
final layer norm. The pooled output is the last state at the end token: the first position holding
``eos_token_id``, or, for configs written before transformers' PR #24773 (``eos_token_id`` 2), the position of the
largest id (the end token has CLIP's largest id). The vision tower: a ``patch_size``-strided convolution, the
class embedding first, position embeddings, a layer norm before the layers, and the class token's state through
``post_layernorm`` pooled. Images are NCHW, as transformers takes them.

Nothing here imports transformers, diffusers or torch (issue #60).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import combine_masks, make_causal_mask
from flax.linen.attention import dot_product_attention_weights
from jax import lax

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.activations import ACTIVATIONS
from sdjax_runner.models.nn.config import Config, FromDiffusersConfig, config_fields

# The keys of transformers' CLIPTextConfig config.json that change what is computed, with its defaults.
TEXT_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "projection_dim": 512,  # the width of text_projection (with_projection only)
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "eos_token_id": 49407,  # the pooled token (2: the largest id, see the module docstring)
}
# CLIPVisionConfig's, likewise.
VISION_CONFIG_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "projection_dim": 512,  # read by CLIPVisionModelWithProjection only (not here)
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
# CLIPConfig's own keys (its towers' are text_config and vision_config).
CLIP_CONFIG_DEFAULTS: dict[str, Any] = {
    "text_config": {},
    "vision_config": {},
    "projection_dim": 512,
    "logit_scale_init_value": 2.6592,
}

# transformers' generic PretrainedConfig keys (every config.json transformers writes has some, old ones all) and
# CLIP's that change nothing computed at inference: dropouts (inference is deterministic), initialisation, token
# ids the model does not read, generation settings, output switches, bookkeeping. ``pruned_heads`` is read by
# :meth:`CLIPTextModel.check` (refused unless empty).
CONFIG_IGNORED: tuple[str, ...] = (
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "initializer_range",
    "initializer_factor", "attention_dropout", "dropout", "bos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id", "add_cross_attention",
    "cross_attention_hidden_size", "is_decoder", "is_encoder_decoder", "tie_encoder_decoder", "tie_word_embeddings",
    "chunk_size_feed_forward", "bad_words_ids", "begin_suppress_tokens", "suppress_tokens", "diversity_penalty",
    "do_sample", "early_stopping", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_scores", "remove_invalid_values", "repetition_penalty", "return_dict_in_generate",
    "temperature", "top_k", "top_p", "typical_p", "finetuning_task", "id2label", "label2id", "problem_type",
    "prefix", "task_specific_params", "tokenizer_class", "output_attentions", "output_hidden_states", "return_dict",
    "torchscript", "tf_legacy_loss", "use_bfloat16", "pruned_heads", "gradient_checkpointing", "use_cache",
    "xla_device",
)

# The text tower's end token means nothing to the vision tower or CLIPConfig's own keys (transformers writes it in
# every config).
OTHER_IGNORED: tuple[str, ...] = (*CONFIG_IGNORED, "eos_token_id")

TEXT_ARCHITECTURES = {"CLIPTextModel": False, "CLIPTextModelWithProjection": True}  # -> with_projection


class FrozenConfig(Config):
    """A config (dict, keys readable as attributes) that is hashable and read-only: a tower's config as a field of
    :class:`CLIPModel` (flax modules are hashed, e.g. by ``jax.jit`` of a bound method)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self.items())))

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles without item assignment
        return FrozenConfig, (dict(self),)

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("FrozenConfig is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only  # type: ignore[assignment]


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def _check_kind(config: Mapping[str, Any], model_types: tuple[Optional[str], ...], what: str) -> None:
    """ValueError for a config.json whose ``model_type`` is another model's."""
    if config.get("model_type") not in model_types:
        raise ValueError(f"{what} config has model_type {config.get('model_type')!r}, not {model_types[-1]!r}")
    if config.get("pruned_heads"):
        raise ValueError(f"{what} config has pruned_heads, which transformers' Flax CLIP does not prune either")


def _check_tower(module: Any, what: str) -> None:
    """ValueError for a tower's values this module cannot compute."""
    problems = []
    if module.hidden_act not in ACTIVATIONS:
        problems.append(f"hidden_act {module.hidden_act!r} is none of {', '.join(sorted(ACTIVATIONS))}")
    if module.num_attention_heads < 1 or module.hidden_size % module.num_attention_heads:
        problems.append(f"hidden_size {module.hidden_size} is no multiple of num_attention_heads "
                        f"{module.num_attention_heads}")
    if problems:
        raise ValueError(f"{what} config: {'; '.join(problems)}")


class CLIPTextOutput(NamedTuple):
    """The text tower's outputs (transformers' ``FlaxBaseModelOutputWithPooling`` / ``FlaxCLIPTextModelOutput``)."""

    last_hidden_state: jax.Array  # (batch, tokens, hidden_size), after final_layer_norm
    pooler_output: jax.Array  # (batch, hidden_size): last_hidden_state at the end token
    hidden_states: Optional[tuple[jax.Array, ...]]  # output_hidden_states: the embeddings, then each layer's output
    text_embeds: Optional[jax.Array]  # with_projection: text_projection(pooler_output), (batch, projection_dim)


class CLIPVisionOutput(NamedTuple):
    """The vision tower's outputs (transformers' ``FlaxBaseModelOutputWithPooling``)."""

    last_hidden_state: jax.Array  # (batch, 1 + patches, hidden_size), before post_layernorm
    pooler_output: jax.Array  # (batch, hidden_size): the class token's state through post_layernorm
    hidden_states: Optional[tuple[jax.Array, ...]]  # output_hidden_states: pre_layrnorm's output, then each layer's


class CLIPOutput(NamedTuple):
    """:class:`CLIPModel`'s outputs (transformers' ``FlaxCLIPOutput`` without the towers' own)."""

    logits_per_image: jax.Array  # (images, texts): exp(logit_scale) * cosine similarity
    logits_per_text: jax.Array  # (texts, images)
    text_embeds: jax.Array  # (texts, projection_dim), L2-normalised
    image_embeds: jax.Array  # (images, projection_dim), L2-normalised


# ----------------------------------------------------------------------------------------------------------------
# The layers both towers share


@dataclasses.dataclass(frozen=True)
class _Tower:
    """A transformer stack's sizes (hashable, a module field). ``causal_positions``: the causal mask's size for
    the text tower (max_position_embeddings), 0 for the vision tower's unmasked attention."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    hidden_act: str
    layer_norm_eps: float
    causal_positions: int = 0


class _Attention(layers.Module):
    """Multi-head self-attention (``FlaxCLIPAttention``), masked causally in the text tower."""

    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.embed_dim = self.tower.hidden_size
        self.num_heads = self.tower.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        init = jax.nn.initializers.normal(0.01)
        self.k_proj = layers.Dense(self.embed_dim, dtype=self.dtype, kernel_init=init)
        self.v_proj = layers.Dense(self.embed_dim, dtype=self.dtype, kernel_init=init)
        self.q_proj = layers.Dense(self.embed_dim, dtype=self.dtype, kernel_init=init)
        self.out_proj = layers.Dense(self.embed_dim, dtype=self.dtype, kernel_init=init)
        if self.tower.causal_positions:
            self.causal_mask = make_causal_mask(jnp.ones((1, self.tower.causal_positions), dtype="i4"))

    def __call__(self, hidden_states: jax.Array, attention_mask: Optional[jax.Array] = None) -> jax.Array:
        heads = (self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states)
        key = self.k_proj(hidden_states)
        value = self.v_proj(hidden_states)
        query = query.reshape(query.shape[:2] + heads)
        key = key.reshape(key.shape[:2] + heads)
        value = value.reshape(value.shape[:2] + heads)

        causal_mask = None
        if self.tower.causal_positions:
            query_length, key_length = query.shape[1], key.shape[1]
            causal_mask = self.causal_mask[:, :, key_length - query_length:key_length, :key_length]
        if attention_mask is not None:
            attention_mask = jnp.expand_dims(attention_mask, axis=(-3, -2))
            if causal_mask is not None:
                attention_mask = combine_masks(attention_mask, causal_mask, dtype="i4")
        else:
            attention_mask = causal_mask

        bias = None
        if attention_mask is not None:
            bias = lax.select(attention_mask > 0,
                              jnp.full(attention_mask.shape, 0.0).astype(self.dtype),
                              jnp.full(attention_mask.shape, jnp.finfo(self.dtype).min).astype(self.dtype))
        weights = dot_product_attention_weights(query, key, bias=bias, dropout_rng=None, dropout_rate=0.0,
                                                deterministic=True, dtype=self.dtype, precision=None)
        out = jnp.einsum("...hqk,...khd->...qhd", weights, value)
        return self.out_proj(out.reshape(out.shape[:2] + (self.embed_dim,)))


class _MLP(layers.Module):
    """fc1, the activation, fc2 (``FlaxCLIPMLP``)."""

    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        init = jax.nn.initializers.normal(0.01)
        self.fc1 = layers.Dense(self.tower.intermediate_size, dtype=self.dtype, kernel_init=init)
        self.fc2 = layers.Dense(self.tower.hidden_size, dtype=self.dtype, kernel_init=init)

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        return self.fc2(ACTIVATIONS[self.tower.hidden_act](self.fc1(hidden_states)))


class _EncoderLayer(layers.Module):
    """A pre-norm transformer layer (``FlaxCLIPEncoderLayer``): x + attn(ln1(x)), then x + mlp(ln2(x))."""

    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.self_attn = _Attention(self.tower, dtype=self.dtype)
        self.layer_norm1 = layers.LayerNorm(epsilon=self.tower.layer_norm_eps, dtype=self.dtype)
        self.mlp = _MLP(self.tower, dtype=self.dtype)
        self.layer_norm2 = layers.LayerNorm(epsilon=self.tower.layer_norm_eps, dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array, attention_mask: Optional[jax.Array]) -> jax.Array:
        hidden_states = hidden_states + self.self_attn(self.layer_norm1(hidden_states), attention_mask)
        return hidden_states + self.mlp(self.layer_norm2(hidden_states))


class _Layers(layers.Module):
    """The layers, named ``0``, ``1``, ... (``FlaxCLIPLayerCollection``, the ``encoder/layers`` scope)."""

    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.layers = [_EncoderLayer(self.tower, name=str(i), dtype=self.dtype)
                       for i in range(self.tower.num_hidden_layers)]

    def __call__(self, hidden_states: jax.Array, attention_mask: Optional[jax.Array],
                 output_hidden_states: bool) -> tuple[jax.Array, Optional[tuple[jax.Array, ...]]]:
        states: tuple[jax.Array, ...] = ()
        for layer in self.layers:
            states += (hidden_states,)
            hidden_states = layer(hidden_states, attention_mask)
        states += (hidden_states,)
        return hidden_states, states if output_hidden_states else None


class _Encoder(layers.Module):
    """``FlaxCLIPEncoder``: the scope ``encoder`` around ``layers``."""

    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.layers = _Layers(self.tower, dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array, attention_mask: Optional[jax.Array] = None,
                 output_hidden_states: bool = False) -> tuple[jax.Array, Optional[tuple[jax.Array, ...]]]:
        return self.layers(hidden_states, attention_mask, output_hidden_states)


# ----------------------------------------------------------------------------------------------------------------
# The text tower


class _TextEmbeddings(layers.Module):
    """Token plus position embeddings (``FlaxCLIPTextEmbeddings``; float32 tables, added in float32)."""

    vocab_size: int
    hidden_size: int
    max_position_embeddings: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        init = jax.nn.initializers.normal()
        self.token_embedding = layers.Embed(self.vocab_size, self.hidden_size, embedding_init=init)
        self.position_embedding = layers.Embed(self.max_position_embeddings, self.hidden_size, embedding_init=init)

    def __call__(self, input_ids: jax.Array, position_ids: jax.Array) -> jax.Array:
        return self.token_embedding(input_ids.astype("i4")) + self.position_embedding(position_ids.astype("i4"))


class _TextTransformer(layers.Module):
    """``FlaxCLIPTextTransformer``: embeddings, encoder, final_layer_norm, and the pooled end-token state."""

    vocab_size: int
    max_position_embeddings: int
    eos_token_id: int
    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.embeddings = _TextEmbeddings(self.vocab_size, self.tower.hidden_size, self.max_position_embeddings,
                                          dtype=self.dtype)
        self.encoder = _Encoder(self.tower, dtype=self.dtype)
        self.final_layer_norm = layers.LayerNorm(epsilon=self.tower.layer_norm_eps, dtype=self.dtype)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, position_ids: jax.Array,
                 output_hidden_states: bool = False) -> CLIPTextOutput:
        hidden_states = self.embeddings(input_ids, position_ids)
        last, states = self.encoder(hidden_states, attention_mask, output_hidden_states)
        last = self.final_layer_norm(last)
        # Configs from before transformers' PR #24773 (eos_token_id 2): the end token is the largest id.
        end = input_ids.argmax(axis=-1) if self.eos_token_id == 2 else (input_ids == self.eos_token_id).argmax(axis=-1)
        pooled = last[jnp.arange(last.shape[0]), end]
        return CLIPTextOutput(last, pooled, states, None)


def _text_transformer(config: Mapping[str, Any], dtype: Any) -> _TextTransformer:
    """The text tower of a (complete) text config: a :class:`CLIPTextModel`'s ``.config``."""
    tower = _Tower(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                   config["num_attention_heads"], config["hidden_act"], config["layer_norm_eps"],
                   causal_positions=config["max_position_embeddings"])
    return _TextTransformer(config["vocab_size"], config["max_position_embeddings"], config["eos_token_id"], tower,
                            dtype=dtype)


def _text_inputs(input_ids: Any, attention_mask: Any, position_ids: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """transformers' Flax wrapper's defaults and casts: the mask all ones, positions ``arange`` broadcast over the
    batch, all int32."""
    if position_ids is None:
        position_ids = jnp.broadcast_to(jnp.arange(jnp.atleast_2d(input_ids).shape[-1]), input_ids.shape)
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    return (jnp.array(input_ids, dtype="i4"), jnp.array(attention_mask, dtype="i4"),
            jnp.array(position_ids, dtype="i4"))


def _init_text_inputs() -> tuple[jax.Array, jax.Array, jax.Array]:
    input_ids = jnp.zeros((1, 1), dtype="i4")
    position_ids = jnp.broadcast_to(jnp.arange(jnp.atleast_2d(input_ids).shape[-1]), (1, 1))
    return input_ids, jnp.ones_like(input_ids), position_ids


def _init_rngs(rng: jax.Array) -> dict[str, jax.Array]:
    """transformers' ``init_weights`` split: the same key gives the same parameters."""
    params_rng, dropout_rng = jax.random.split(rng)
    return {"params": params_rng, "dropout": dropout_rng}


class CLIPTextModel(FromDiffusersConfig, layers.Module):
    """CLIP's text encoder: transformers' ``FlaxCLIPTextModel``, or ``FlaxCLIPTextModelWithProjection`` with
    ``with_projection`` (SDXL's second encoder, SD 3's two, and ``text_embeds`` = ``text_projection`` of the pooled
    output, no bias).

    The fields up to ``eos_token_id`` are CLIPTextConfig's config.json keys that change the computation, with
    transformers' defaults (build it with :meth:`from_config`; other known transformers keys change nothing and
    are skipped, unknown ones refused). ``with_projection`` is no config key: transformers picks the class from
    ``architectures``, and so does :meth:`from_config` (``CLIPTextModelWithProjection`` -> True; absent or
    ``CLIPTextModel`` -> False; another architecture refused) unless it is given. ``dtype`` is the activations'
    dtype (parameters are float32; the embeddings are added in float32, as transformers does).

    ``__call__(input_ids, attention_mask=None, position_ids=None, output_hidden_states=False)`` ->
    :class:`CLIPTextOutput`; the mask defaults to ones and the positions to ``arange`` over the batch, as
    transformers' wrapper sets them."""

    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    projection_dim: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 49407
    with_projection: bool = False
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = TEXT_CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "CLIP text"
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = CONFIG_IGNORED

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a CLIPTextConfig config.json (a dict); ``with_projection`` from ``architectures`` unless
        given. ValueError for a config it cannot run."""
        _check_kind(config, (None, "clip_text_model"), cls.CONFIG_WHAT)
        if "with_projection" not in kwargs:
            architectures = config.get("architectures") or []
            unknown = [a for a in architectures if a not in TEXT_ARCHITECTURES]
            if unknown or len(architectures) > 1:
                raise ValueError(f"CLIP text config has architectures {architectures}, not one of "
                                 f"{', '.join(TEXT_ARCHITECTURES)}")
            kwargs["with_projection"] = bool(architectures) and TEXT_ARCHITECTURES[architectures[0]]
        return super().from_config(config, **kwargs)

    def check(self) -> None:
        """ValueError for a config this module cannot compute: an activation transformers' Flax CLIP does not
        have, heads that do not divide the width, no single integer end token."""
        _check_tower(self, self.CONFIG_WHAT)
        if not isinstance(self.eos_token_id, int) or isinstance(self.eos_token_id, bool):
            raise ValueError(f"CLIP text config: eos_token_id {self.eos_token_id!r} is no single token id")

    def setup(self) -> None:
        self.text_model = _text_transformer(self.config, self.dtype)
        if self.with_projection:
            self.text_projection = layers.Dense(self.projection_dim, use_bias=False, dtype=self.dtype)

    def __call__(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None,
                 output_hidden_states: bool = False) -> CLIPTextOutput:
        out = self.text_model(*_text_inputs(input_ids, attention_mask, position_ids), output_hidden_states)
        if self.with_projection:
            out = out._replace(text_embeds=self.text_projection(out.pooler_output))
        return out

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` key), transformers' for the same key;
        ``jax.eval_shape(module.init_weights, key)`` costs nothing."""
        return self.init(_init_rngs(rng), *_init_text_inputs())["params"]


# ----------------------------------------------------------------------------------------------------------------
# The vision tower


class _VisionEmbeddings(layers.Module):
    """``FlaxCLIPVisionEmbeddings``: the class embedding, then the patches' (a strided convolution, no bias), plus
    position embeddings. Takes NHWC pixels."""

    hidden_size: int
    image_size: int
    patch_size: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        embed_dim, patch = self.hidden_size, self.patch_size
        self.class_embedding = self.param("class_embedding", jax.nn.initializers.normal(stddev=0.02), (embed_dim,))
        self.patch_embedding = layers.Conv(embed_dim, kernel_size=(patch, patch), strides=(patch, patch),
                                       padding="VALID", use_bias=False, dtype=self.dtype,
                                       kernel_init=jax.nn.initializers.normal())
        num_positions = (self.image_size // patch) ** 2 + 1
        self.position_embedding = layers.Embed(num_positions, embed_dim, embedding_init=jax.nn.initializers.normal())
        self.position_ids = jnp.expand_dims(jnp.arange(0, num_positions, dtype="i4"), axis=0)

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        patch_embeds = self.patch_embedding(pixel_values)
        batch_size, height, width, channels = patch_embeds.shape
        patch_embeds = jnp.reshape(patch_embeds, (batch_size, height * width, channels))
        class_embeds = jnp.tile(jnp.expand_dims(self.class_embedding, axis=(0, 1)), (batch_size, 1, 1))
        embeddings = jnp.concatenate([class_embeds, patch_embeds], axis=1)
        return embeddings + self.position_embedding(self.position_ids)


class _VisionTransformer(layers.Module):
    """``FlaxCLIPVisionTransformer``: embeddings, pre_layrnorm (transformers' spelling), encoder, and the class
    token's state through post_layernorm pooled."""

    image_size: int
    patch_size: int
    tower: _Tower
    dtype: Any = jnp.float32

    def setup(self) -> None:
        eps = self.tower.layer_norm_eps
        self.embeddings = _VisionEmbeddings(self.tower.hidden_size, self.image_size, self.patch_size,
                                            dtype=self.dtype)
        self.pre_layrnorm = layers.LayerNorm(epsilon=eps, dtype=self.dtype)
        self.encoder = _Encoder(self.tower, dtype=self.dtype)
        self.post_layernorm = layers.LayerNorm(epsilon=eps, dtype=self.dtype)

    def __call__(self, pixel_values: jax.Array, output_hidden_states: bool = False) -> CLIPVisionOutput:
        hidden_states = self.pre_layrnorm(self.embeddings(pixel_values))
        last, states = self.encoder(hidden_states, None, output_hidden_states)
        return CLIPVisionOutput(last, self.post_layernorm(last[:, 0, :]), states)


def _vision_transformer(config: Mapping[str, Any], dtype: Any) -> _VisionTransformer:
    """The vision tower of a (complete) vision config: a :class:`CLIPVisionModel`'s ``.config``."""
    tower = _Tower(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                   config["num_attention_heads"], config["hidden_act"], config["layer_norm_eps"])
    return _VisionTransformer(config["image_size"], config["patch_size"], tower, dtype=dtype)


def _pixels(pixel_values: Any) -> jax.Array:
    """NCHW pixels as the towers take them: NHWC float32 (transformers' wrapper's transpose and cast)."""
    return jnp.array(jnp.transpose(pixel_values, (0, 2, 3, 1)), dtype=jnp.float32)


class CLIPVisionModel(FromDiffusersConfig, layers.Module):
    """CLIP's vision encoder: transformers' ``FlaxCLIPVisionModel`` (the fields: CLIPVisionConfig's config.json
    keys that change the computation, transformers' defaults; ``projection_dim`` is kept and unused).

    ``__call__(pixel_values, output_hidden_states=False)`` -> :class:`CLIPVisionOutput`; ``pixel_values`` NCHW,
    ``image_size`` square, as transformers takes them."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    projection_dim: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 32
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = VISION_CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "CLIP vision"
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = OTHER_IGNORED

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a CLIPVisionConfig config.json (a dict). ValueError for a config it cannot run."""
        _check_kind(config, (None, "clip_vision_model"), cls.CONFIG_WHAT)
        architectures = config.get("architectures") or []
        if any(a != "CLIPVisionModel" for a in architectures):
            raise ValueError(f"CLIP vision config has architectures {architectures}, not CLIPVisionModel")
        return super().from_config(config, **kwargs)

    def check(self) -> None:
        """ValueError for a config this module cannot compute (see :meth:`CLIPTextModel.check`; and patches
        that do not tile the image)."""
        _check_tower(self, self.CONFIG_WHAT)
        _check_patches(self.image_size, self.patch_size, self.CONFIG_WHAT)

    def setup(self) -> None:
        self.vision_model = _vision_transformer(self.config, self.dtype)

    def __call__(self, pixel_values: Any, output_hidden_states: bool = False) -> CLIPVisionOutput:
        return self.vision_model(_pixels(pixel_values), output_hidden_states)

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` key), transformers' for the same key."""
        shape = (1, self.num_channels, self.image_size, self.image_size)
        return self.init(_init_rngs(rng), jnp.zeros(shape, jnp.float32))["params"]


def _check_patches(image_size: int, patch_size: int, what: str) -> None:
    if patch_size < 1 or image_size % patch_size:
        raise ValueError(f"{what} config: image_size {image_size} is no multiple of patch_size {patch_size}")


# ----------------------------------------------------------------------------------------------------------------
# The full model


def clip_tower_configs(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A CLIPConfig config.json's (text config, vision config), merged as transformers' ``CLIPConfig`` merges
    them: an old file's ``text_config_dict`` / ``vision_config_dict`` win over ``text_config`` / ``vision_config``,
    *with their defaults* (transformers updates the tower's dict with ``CLIPTextConfig(**text_config_dict)``'s
    whole ``to_dict()``; so openai/clip-vit-large-patch14, whose ``text_config`` says ``eos_token_id`` 2, pools at
    the token 49407)."""
    towers = []
    for name, defaults in (("text", TEXT_CONFIG_DEFAULTS), ("vision", VISION_CONFIG_DEFAULTS)):
        tower = dict(config.get(f"{name}_config") or {})
        old = config.get(f"{name}_config_dict")
        if old is not None:
            tower.update({**defaults, **old})
        towers.append(tower)
    return towers[0], towers[1]


class CLIPModel(FromDiffusersConfig, layers.Module):
    """CLIP: transformers' ``FlaxCLIPModel``, the text and vision towers, their projections (no bias) and
    ``logit_scale``. ``text_config`` and ``vision_config`` are the towers' configs (a :class:`CLIPTextModel`'s and
    a :class:`CLIPVisionModel`'s ``.config`` keys; given as dicts, they are completed with transformers' defaults
    and frozen, :class:`FrozenConfig`); build the model with :meth:`from_config` from a CLIPConfig config.json.

    * ``text_features(input_ids, attention_mask=None, position_ids=None)``: ``get_text_features``, the text
      projection of the pooled end-token state;
    * ``image_features(pixel_values)``: ``get_image_features`` (NCHW pixels), the visual projection of the pooled
      class token;
    * ``__call__(input_ids, pixel_values, attention_mask=None, position_ids=None)`` -> :class:`CLIPOutput`.

    Call them with ``module.apply({"params": params}, ..., method="text_features")``."""

    text_config: FrozenConfig = FrozenConfig(TEXT_CONFIG_DEFAULTS)
    vision_config: FrozenConfig = FrozenConfig(VISION_CONFIG_DEFAULTS)
    projection_dim: int = 512
    logit_scale_init_value: float = 2.6592
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CLIP_CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "CLIP"
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = OTHER_IGNORED

    def __post_init__(self) -> None:
        # The towers' configs complete (transformers' defaults for keys not given) and frozen (the module must hash).
        for name, defaults in (("text_config", TEXT_CONFIG_DEFAULTS), ("vision_config", VISION_CONFIG_DEFAULTS)):
            given = getattr(self, name)
            if not isinstance(given, FrozenConfig) or set(given) != set(defaults):
                object.__setattr__(self, name, FrozenConfig({**defaults, **given}))
        super().__post_init__()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a CLIPConfig config.json (a dict; its towers' configs merged as transformers does, see
        :func:`clip_tower_configs`). ValueError for a config it cannot run, or another architecture's
        (``architectures`` other than CLIPModel: the weights would be another tree)."""
        _check_kind(config, (None, "clip"), cls.CONFIG_WHAT)
        architectures = config.get("architectures") or []
        if any(a != "CLIPModel" for a in architectures):
            raise ValueError(f"CLIP config has architectures {architectures}, not CLIPModel")
        text, vision = clip_tower_configs(config)
        own = {k: v for k, v in config.items()
               if k not in ("text_config", "vision_config", "text_config_dict", "vision_config_dict")}
        values = config_fields(own, cls.CONFIG_DEFAULTS, cls.CONFIG_WHAT, ignored=cls.CONFIG_IGNORED)
        module = cls(text_config=FrozenConfig(CLIPTextModel.from_config(text, with_projection=False).config),
                     vision_config=FrozenConfig(CLIPVisionModel.from_config(vision).config), **values, **kwargs)
        module.check()
        return module

    def check(self) -> None:
        """ValueError for towers' configs the towers cannot compute."""
        CLIPTextModel(**self.text_config, parent=None).check()
        CLIPVisionModel(**self.vision_config, parent=None).check()

    def setup(self) -> None:
        self.text_model = _text_transformer(self.text_config, self.dtype)
        self.vision_model = _vision_transformer(self.vision_config, self.dtype)
        init = jax.nn.initializers.normal(0.02)
        self.visual_projection = layers.Dense(self.projection_dim, dtype=self.dtype, kernel_init=init, use_bias=False)
        self.text_projection = layers.Dense(self.projection_dim, dtype=self.dtype, kernel_init=init, use_bias=False)
        self.logit_scale = self.param("logit_scale", lambda _, shape: jnp.ones(shape) * self.logit_scale_init_value,
                                      [])

    def text_features(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None) -> jax.Array:
        """``get_text_features``: (batch, projection_dim), not normalised."""
        pooled = self.text_model(*_text_inputs(input_ids, attention_mask, position_ids)).pooler_output
        return self.text_projection(pooled)

    def image_features(self, pixel_values: Any) -> jax.Array:
        """``get_image_features`` of NCHW pixels: (batch, projection_dim), not normalised."""
        return self.visual_projection(self.vision_model(_pixels(pixel_values)).pooler_output)

    def __call__(self, input_ids: Any, pixel_values: Any, attention_mask: Any = None,
                 position_ids: Any = None) -> CLIPOutput:
        image_embeds = self.image_features(pixel_values)
        text_embeds = self.text_features(input_ids, attention_mask, position_ids)
        image_embeds = image_embeds / jnp.linalg.norm(image_embeds, axis=-1, keepdims=True)
        text_embeds = text_embeds / jnp.linalg.norm(text_embeds, axis=-1, keepdims=True)
        logits_per_text = jnp.matmul(text_embeds, image_embeds.T) * jnp.exp(self.logit_scale)
        return CLIPOutput(logits_per_text.T, logits_per_text, text_embeds, image_embeds)

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` key), transformers' for the same key."""
        vision = self.vision_config
        pixels = jnp.zeros((1, vision["num_channels"], vision["image_size"], vision["image_size"]), jnp.float32)
        return self.init(_init_rngs(rng), _init_text_inputs()[0], pixels)["params"]


# ----------------------------------------------------------------------------------------------------------------
# Image preprocessing


# preprocessor_config.json keys that change nothing computed.
PREPROCESSOR_IGNORED = ("image_processor_type", "feature_extractor_type", "processor_class")
PREPROCESSOR_DEFAULTS: dict[str, Any] = {
    "do_resize": True,
    "size": {"shortest_edge": 224},
    "resample": 3,  # PIL.Image.Resampling.BICUBIC
    "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],  # OpenAI CLIP's
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
    "use_square_size": False,  # an old (Kosmos-2) flag: resize to a shortest_edge square
}


def _size_dict(size: Any, square: bool, key: str) -> dict[str, int]:
    """transformers' ``get_size_dict``: an int is a square (crop sizes) or a shortest edge (resizes); a pair is
    (height, width)."""
    if isinstance(size, Mapping):
        if set(size) in ({"height", "width"}, {"shortest_edge"}, {"shortest_edge", "longest_edge"}):
            return {k: int(v) for k, v in size.items()}
    elif isinstance(size, int) and not isinstance(size, bool):
        return {"height": size, "width": size} if square else {"shortest_edge": size}
    elif isinstance(size, (list, tuple)) and len(size) == 2:
        return {"height": int(size[0]), "width": int(size[1])}
    raise ValueError(f"CLIP image processor config: {key} {size!r} is no size this processor reads")


@dataclasses.dataclass(frozen=True)
class CLIPImagePreprocessor:
    """transformers' ``CLIPImageProcessor`` (``image_processing_clip.py``) in NumPy and Pillow, step for step:
    RGB, resize (the shortest edge to ``size["shortest_edge"]``, the other edge ``int(edge * long / short)``, or to
    ``height`` x ``width``) with Pillow's ``resample`` filter on the uint8 image, a centre crop (zero-padded where
    the image is smaller), ``uint8 -> float64 * rescale_factor -> float32``, ``(x - mean) / std`` in float32, and
    channels first. Build it with :meth:`from_config` from a preprocessor_config.json dict; calling it gives the
    batch, (N, 3, height, width) float32, equal to the processor's ``pixel_values``."""

    do_resize: bool = True
    size: tuple[tuple[str, int], ...] = (("shortest_edge", 224),)
    resample: int = 3
    do_center_crop: bool = True
    crop_size: tuple[int, int] = (224, 224)  # (height, width)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = tuple(PREPROCESSOR_DEFAULTS["image_mean"])
    image_std: tuple[float, ...] = tuple(PREPROCESSOR_DEFAULTS["image_std"])
    do_convert_rgb: bool = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CLIPImagePreprocessor:
        """The preprocessing a preprocessor_config.json (a dict) describes, old (``CLIPFeatureExtractor``: int
        sizes) or new. ValueError for keys or sizes it does not read."""
        values = {**PREPROCESSOR_DEFAULTS, **config_fields(config, PREPROCESSOR_DEFAULTS, "CLIP image processor",
                                                           ignored=PREPROCESSOR_IGNORED)}
        size = _size_dict(values["size"], False, "size")
        if values["use_square_size"] and "shortest_edge" in size:
            size = {"height": size["shortest_edge"], "width": size["shortest_edge"]}
        crop = _size_dict(values["crop_size"], True, "crop_size")
        if "height" not in crop:
            raise ValueError(f"CLIP image processor config: crop_size {values['crop_size']!r} has no height/width")
        channels = []
        for key in ("image_mean", "image_std"):
            value = values[key]
            channels.append(tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * 3)
            if len(channels[-1]) != 3:
                raise ValueError(f"CLIP image processor config: {key} {value!r} is not one value per RGB channel")
        return cls(bool(values["do_resize"]), tuple(sorted(size.items())), int(values["resample"]),
                   bool(values["do_center_crop"]), (crop["height"], crop["width"]), bool(values["do_rescale"]),
                   float(values["rescale_factor"]), bool(values["do_normalize"]), channels[0], channels[1],
                   bool(values["do_convert_rgb"]))

    def _resized_size(self, height: int, width: int) -> tuple[int, int]:
        """transformers' ``get_resize_output_image_size`` (a ``longest_edge`` is not read, as CLIP's does not)."""
        size = dict(self.size)
        if "shortest_edge" not in size:
            return size["height"], size["width"]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = size["shortest_edge"], int(size["shortest_edge"] * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def _center_crop(self, image: np.ndarray) -> np.ndarray:
        """transformers' ``center_crop`` of an HWC image: zero-padded (centred, the extra row/column first) where
        the image is smaller than the crop."""
        height, width = image.shape[:2]
        crop_height, crop_width = self.crop_size
        top, left = (height - crop_height) // 2, (width - crop_width) // 2
        if top >= 0 and left >= 0:
            return image[top:top + crop_height, left:left + crop_width]
        new_height, new_width = max(crop_height, height), max(crop_width, width)
        padded = np.zeros((new_height, new_width) + image.shape[2:], dtype=image.dtype)
        top_pad, left_pad = math.ceil((new_height - height) / 2), math.ceil((new_width - width) / 2)
        padded[top_pad:top_pad + height, left_pad:left_pad + width] = image
        top, left = top + top_pad, left + left_pad
        return padded[max(0, top):min(new_height, top + crop_height), max(0, left):min(new_width, left + crop_width)]

    def one(self, image: Any) -> np.ndarray:
        """One image (a PIL image, or a uint8 HxWx3 RGB array) -> (3, height, width)."""
        from PIL import Image

        if isinstance(image, Image.Image):
            if self.do_convert_rgb and image.mode != "RGB":
                image = image.convert("RGB")
            array = np.array(image)
        else:
            array = np.asarray(image)
            if array.dtype != np.uint8:
                raise ValueError(f"CLIP image preprocessing takes uint8 arrays (0-255), not {array.dtype}")
        if array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError(f"CLIP image preprocessing takes RGB images (H, W, 3), not shape {array.shape}")
        if self.do_resize:
            height, width = self._resized_size(*array.shape[:2])
            resample = Image.Resampling(self.resample)
            array = np.array(Image.fromarray(array).resize((width, height), resample=resample, reducing_gap=None))
        if self.do_center_crop:
            array = self._center_crop(array)
        if self.do_rescale:
            array = (array.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            if not np.issubdtype(array.dtype, np.floating):
                array = array.astype(np.float32)
            array = (array - np.array(self.image_mean, dtype=array.dtype)) / np.array(self.image_std,
                                                                                      dtype=array.dtype)
        return array.transpose(2, 0, 1)

    def __call__(self, images: Sequence[Any]) -> np.ndarray:
        """The batch (N, 3, height, width): what ``CLIPImageProcessor(images, return_tensors="np")`` gives as
        ``pixel_values`` (float32 when rescaled or normalised)."""
        arrays = [self.one(image) for image in images]
        if len({a.shape for a in arrays}) > 1:
            raise ValueError("CLIP image preprocessing: the images differ in size after resize and crop")
        return np.stack(arrays)


def preprocess_images(images: Sequence[Any], config: Mapping[str, Any]) -> np.ndarray:
    """CLIP's pixel values (N, 3, height, width) of ``images`` (PIL images or uint8 HxWx3 RGB arrays) as a
    preprocessor_config.json (a dict) says: :class:`CLIPImagePreprocessor`."""
    return CLIPImagePreprocessor.from_config(config)(images)
