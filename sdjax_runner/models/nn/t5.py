"""T5's encoder in flax.linen: FLUX.1's ``text_encoder_2`` and SD 3's ``text_encoder_3`` (T5 v1.1 XXL: gated-gelu
feed-forward, 24 layers of width 4096), and any T5 / T5 v1.1 encoder config (``relu`` or ``gated-*``).

The JAX twin of transformers 4.57's ``FlaxT5EncoderModel`` (``models/t5/modeling_flax_t5.py``, no longer in
transformers 5): the same flax layers with the same arguments, in the same order, with the same casts, so on the
same weights the outputs are bit-for-bit transformers' (CPU, float32, under ``jax.jit``; tests/test_t5_modules.py).
The parameter tree is transformers' Flax one -- ``shared/embedding``,
``encoder/block/N/layer/0/{layer_norm,SelfAttention/{q,k,v,o}}``, ``encoder/block/0/layer/0/SelfAttention/
relative_attention_bias/embedding``, ``encoder/block/N/layer/1/{layer_norm,DenseReluDense/{wi_0,wi_1,wo|wi,wo}}``,
``encoder/final_layer_norm/weight`` -- so its ``flax_model.msgpack`` folders and PyTorch weights converted with
its renaming load unchanged.

What it computes: the token embeddings (``shared``, unscaled); per layer, ``x + attention(rms_norm(x))`` then
``x + feed_forward(rms_norm(x))``; the final RMS norm. T5's specifics, as transformers has them:

* the RMS norm (:class:`RMSNorm`) computes its variance in float32, has a weight and no bias, and hands the next
  layer float32 whatever ``dtype`` is;
* attention has no ``1/sqrt(d_kv)`` scaling (transformers multiplies the query by ``sqrt(d_kv)`` before flax's
  attention weights divide by it again -- kept, for the same rounding);
* a learnt bias per head and *relative position bucket* (:func:`relative_position_bucket`) is added to the
  attention logits; only the first layer has the table, every layer adds its bias -- with the attention mask's
  zeros as the dtype's most negative value added once, into that shared bias;
* the feed-forward is ``wo(act(wi(x)))`` (``relu``) or ``wo(act(wi_0(x)) * wi_1(x))`` (``gated-*``; "gated-gelu"
  is tanh-approximated GELU, transformers' ``gelu_new``).

Dropout is left out: inference is deterministic. Nothing here imports transformers, diffusers or torch (#60).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax.linen.attention import dot_product_attention_weights

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.activations import ACTIVATIONS
from sdjax_runner.models.nn.config import Config, FromDiffusersConfig

# The keys of transformers' T5Config config.json that change what the encoder computes, with T5Config's defaults.
# ``dense_act_fn`` and ``is_gated_act`` follow from ``feed_forward_proj`` where a config leaves them out (T5Config
# derives them so; a config.json that has them wins, as it does in transformers).
CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-6,
    "feed_forward_proj": "relu",
    "dense_act_fn": None,
    "is_gated_act": None,
}

# T5Config's attribute_map: other names transformers reads (and writes into) these keys by. A config.json that has
# one sets the key (it wins over the key itself, as in T5Config); ``module.config.hidden_size`` reads d_model.
ALIASES: dict[str, str] = {"hidden_size": "d_model", "num_attention_heads": "num_heads",
                           "num_hidden_layers": "num_layers", "head_dim": "d_kv"}

# transformers' generic PretrainedConfig keys and T5Config's that change nothing the encoder computes at inference:
# dropouts (inference is deterministic), initialisation, the decoder's settings and token ids (an encoder reads
# none), generation settings, output switches, bookkeeping. ``n_positions`` is the original T5 configs' nominal
# length (relative positions need none).
CONFIG_IGNORED: tuple[str, ...] = (
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "initializer_factor",
    "dropout_rate", "classifier_dropout", "num_decoder_layers", "decoder_start_token_id", "bos_token_id",
    "eos_token_id", "pad_token_id", "sep_token_id", "forced_bos_token_id", "forced_eos_token_id", "is_decoder",
    "is_encoder_decoder", "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder",
    "tie_word_embeddings", "use_cache", "output_past", "n_positions", "chunk_size_feed_forward", "bad_words_ids",
    "begin_suppress_tokens", "suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_return_sequences", "output_scores",
    "remove_invalid_values", "repetition_penalty", "return_dict_in_generate", "temperature", "top_k", "top_p",
    "typical_p", "finetuning_task", "id2label", "label2id", "problem_type", "prefix", "task_specific_params",
    "tokenizer_class", "output_attentions", "output_hidden_states", "return_dict", "torchscript", "tf_legacy_loss",
    "use_bfloat16", "pruned_heads", "gradient_checkpointing", "xla_device",
)


def feed_forward_kind(feed_forward_proj: Any) -> tuple[str, bool]:
    """(``dense_act_fn``, ``is_gated_act``) for a ``feed_forward_proj`` as T5Config derives them: ``"ACT"`` or
    ``"gated-ACT"``, and "gated-gelu" means ``gelu_new`` (tanh GELU). ValueError for another form."""
    parts = feed_forward_proj.split("-") if isinstance(feed_forward_proj, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"T5 config: feed_forward_proj {feed_forward_proj!r} is neither 'ACT' nor 'gated-ACT' "
                         "(e.g. 'relu', 'gated-gelu')")
    if feed_forward_proj == "gated-gelu":
        return "gelu_new", True
    return parts[-1], parts[0] == "gated"


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128) -> jax.Array:
    """T5's bucket (int32) of each relative position ``key - query`` (Mesh TensorFlow's rule, as transformers
    computes it). Bidirectional (the encoder): half the buckets for positive offsets. Of each half, the first
    ``num_buckets // 4`` are exact offsets 0, 1, 2, ...; the rest grow logarithmically up to ``max_distance``, and
    every farther offset shares the last bucket.

    transformers 4.57 caps with ``jnp.clip(x, a_max=...)``, a keyword JAX 0.10 removed; this caps with
    ``jnp.minimum``, which is what ``clip`` with only an upper bound computes: the same buckets, bit for bit, and
    the same float32 intermediates (a float32 bucket truncated to int32)."""
    relative_buckets: Any = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0) * num_buckets
        relative_position = jnp.abs(relative_position)
    else:
        relative_position = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    # log(0) is -inf where the position is small; jnp.where picks the exact bucket there
    if_large = max_exact + (jnp.log(relative_position / max_exact) / jnp.log(max_distance / max_exact)
                            * (num_buckets - max_exact))
    if_large = jnp.minimum(if_large, num_buckets - 1)
    relative_buckets += jnp.where(is_small, relative_position, if_large)
    return relative_buckets.astype("i4")


class T5EncoderOutput(NamedTuple):
    """The encoder's outputs (transformers' ``FlaxBaseModelOutput`` fields the runner reads; ``[0]`` is
    ``last_hidden_state`` there too)."""

    last_hidden_state: jax.Array  # (batch, tokens, d_model), after final_layer_norm
    # output_hidden_states: the embeddings, each layer's output but the last, then last_hidden_state (transformers'
    # tuple: num_layers + 1 arrays, the last layer's output appearing only normed)
    hidden_states: Optional[tuple[jax.Array, ...]] = None


class _T5Config(Config):
    """A T5 config: its keys, and T5Config's aliases of them (:data:`ALIASES`), readable as attributes."""

    def __getattr__(self, name: str) -> Any:
        return super().__getattr__(ALIASES.get(name, name))


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the layers read of a config (hashable: a module field), ``dense_act_fn`` / ``is_gated_act`` resolved
    as :meth:`T5EncoderModel.sizes` gives them."""

    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    num_buckets: int  # relative_attention_num_buckets
    max_distance: int  # relative_attention_max_distance
    eps: float  # layer_norm_epsilon
    activation: str  # dense_act_fn
    gated: bool  # is_gated_act


class RMSNorm(layers.Module):
    """T5's layer norm (``FlaxT5LayerNorm``): ``weight * x / sqrt(mean(x^2) + eps)``, the mean of squares in
    float32, no mean subtracted, no bias. ``dtype`` is unused (kept as transformers has the field)."""

    hidden_size: int
    eps: float = 1e-6
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.weight = self.param("weight", jax.nn.initializers.ones, (self.hidden_size,))

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        variance = jnp.power(hidden_states.astype("f4"), 2).mean(axis=-1, keepdims=True)
        hidden_states = hidden_states / jnp.sqrt(variance + self.eps)
        return self.weight * hidden_states


def _dense(features: int, std: float, dtype: Any, name: Optional[str] = None) -> layers.Dense:
    """A bias-free dense layer with T5's normal initialisation (standard deviation ``std``)."""
    return layers.Dense(features, use_bias=False, kernel_init=jax.nn.initializers.normal(std), dtype=dtype, name=name)


class _SelfAttention(layers.Module):
    """``FlaxT5Attention`` of the encoder (bidirectional, no cache): q, k, v, o without bias, and, in the first
    layer, the ``relative_attention_bias`` table (buckets x heads)."""

    d_model: int
    d_kv: int
    num_heads: int
    num_buckets: int
    max_distance: int
    has_relative_attention_bias: bool = False
    dtype: Any = jnp.float32

    def setup(self) -> None:
        inner = self.num_heads * self.d_kv
        self.q = _dense(inner, (inner * self.d_kv) ** -0.5, self.dtype)
        self.k = _dense(inner, inner ** -0.5, self.dtype)
        self.v = _dense(inner, inner ** -0.5, self.dtype)
        self.o = _dense(self.d_model, inner ** -0.5, self.dtype)
        if self.has_relative_attention_bias:
            self.relative_attention_bias = layers.Embed(self.num_buckets, self.num_heads,
                                                    embedding_init=jax.nn.initializers.normal(inner ** -0.5),
                                                    dtype=self.dtype)

    def position_bias(self, query_length: int, key_length: int) -> jax.Array:
        """(1, heads, query_length, key_length): each head's learnt bias for each pair's relative position."""
        context_position = jnp.arange(query_length, dtype="i4")[:, None]
        memory_position = jnp.arange(key_length, dtype="i4")[None, :]
        buckets = relative_position_bucket(memory_position - context_position, bidirectional=True,
                                           num_buckets=self.num_buckets, max_distance=self.max_distance)
        return self.relative_attention_bias(buckets).transpose((2, 0, 1))[None, :, :, :]

    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array,
                 position_bias: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(output, the position bias every later layer adds: this layer's, the mask folded in)."""
        heads = (self.num_heads, self.d_kv)
        query = self.q(hidden_states)
        key = self.k(hidden_states)
        value = self.v(hidden_states)
        query = query.reshape(query.shape[:2] + heads)
        key = key.reshape(key.shape[:2] + heads)
        value = value.reshape(value.shape[:2] + heads)
        query *= jnp.sqrt(query.shape[-1])  # undone by dot_product_attention_weights: T5 does not scale

        if position_bias is None:  # the first layer: its table's bias plus the mask's
            mask = jnp.expand_dims(attention_mask, axis=(-3, -2))
            mask = jax.lax.select(mask > 0, jnp.full(mask.shape, 0.0).astype(self.dtype),
                                  jnp.full(mask.shape, jnp.finfo(self.dtype).min).astype(self.dtype))
            if self.has_relative_attention_bias:
                position_bias = self.position_bias(query.shape[1], key.shape[1])
            else:  # (transformers' zeros where no layer has the table)
                position_bias = jnp.zeros_like(mask)
            position_bias = position_bias + mask

        weights = dot_product_attention_weights(query, key, bias=position_bias, dropout_rng=None, dropout_rate=0.0,
                                                broadcast_dropout=True, deterministic=True, dtype=self.dtype)
        out = jnp.einsum("...hqk,...khd->...qhd", weights, value)
        out = out.reshape(out.shape[:2] + (self.num_heads * self.d_kv,))
        return self.o(out), position_bias


class _SelfAttentionLayer(layers.Module):
    """``FlaxT5LayerSelfAttention``: ``x + SelfAttention(layer_norm(x))``."""

    sizes: Sizes
    has_relative_attention_bias: bool = False
    dtype: Any = jnp.float32

    def setup(self) -> None:
        s = self.sizes
        self.SelfAttention = _SelfAttention(s.d_model, s.d_kv, s.num_heads, s.num_buckets, s.max_distance,
                                            self.has_relative_attention_bias, dtype=self.dtype)
        self.layer_norm = RMSNorm(s.d_model, eps=s.eps, dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array,
                 position_bias: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
        out, position_bias = self.SelfAttention(self.layer_norm(hidden_states), attention_mask, position_bias)
        return hidden_states + out, position_bias


class _DenseActDense(layers.Module):
    """``FlaxT5DenseActDense`` (``wo(act(wi(x)))``) or, with ``gated``, ``FlaxT5DenseGatedActDense``
    (``wo(act(wi_0(x)) * wi_1(x))``)."""

    d_model: int
    d_ff: int
    activation: str
    gated: bool
    dtype: Any = jnp.float32

    def setup(self) -> None:
        if self.gated:
            self.wi_0 = _dense(self.d_ff, self.d_model ** -0.5, self.dtype)
            self.wi_1 = _dense(self.d_ff, self.d_model ** -0.5, self.dtype)
        else:
            self.wi = _dense(self.d_ff, self.d_model ** -0.5, self.dtype)
        self.wo = _dense(self.d_model, self.d_ff ** -0.5, self.dtype)

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        if self.gated:
            hidden_states = act(self.wi_0(hidden_states)) * self.wi_1(hidden_states)
        else:
            hidden_states = act(self.wi(hidden_states))
        return self.wo(hidden_states)


class _FeedForwardLayer(layers.Module):
    """``FlaxT5LayerFF``: ``x + DenseReluDense(layer_norm(x))`` (transformers' name whatever the activation)."""

    sizes: Sizes
    dtype: Any = jnp.float32

    def setup(self) -> None:
        s = self.sizes
        self.DenseReluDense = _DenseActDense(s.d_model, s.d_ff, s.activation, s.gated, dtype=self.dtype)
        self.layer_norm = RMSNorm(s.d_model, eps=s.eps, dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        return hidden_states + self.DenseReluDense(self.layer_norm(hidden_states))


class _Block(layers.Module):
    """``FlaxT5Block`` (the scope ``layer`` of ``block/N``): the self-attention layer ``0``, the feed-forward
    layer ``1``."""

    sizes: Sizes
    has_relative_attention_bias: bool = False
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.attention = _SelfAttentionLayer(self.sizes, self.has_relative_attention_bias, dtype=self.dtype,
                                             name="0")
        self.feed_forward = _FeedForwardLayer(self.sizes, dtype=self.dtype, name="1")

    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array,
                 position_bias: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
        hidden_states, position_bias = self.attention(hidden_states, attention_mask, position_bias)
        return self.feed_forward(hidden_states), position_bias


class _LayerCollection(layers.Module):
    """``FlaxT5LayerCollection`` (the scope ``block/N``): its one child, ``layer``."""

    sizes: Sizes
    has_relative_attention_bias: bool = False
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.layer = _Block(self.sizes, self.has_relative_attention_bias, dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array,
                 position_bias: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
        return self.layer(hidden_states, attention_mask, position_bias)


class _BlockCollection(layers.Module):
    """``FlaxT5BlockCollection`` (the scope ``block``): the layers ``0``, ``1``, ...; the first has the relative
    position table and hands its bias on."""

    sizes: Sizes
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.blocks = [_LayerCollection(self.sizes, has_relative_attention_bias=(i == 0), dtype=self.dtype,
                                        name=str(i)) for i in range(self.sizes.num_layers)]

    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array,
                 output_hidden_states: bool) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        states: tuple[jax.Array, ...] = ()
        position_bias = None
        for block in self.blocks:
            if output_hidden_states:
                states += (hidden_states,)
            hidden_states, position_bias = block(hidden_states, attention_mask, position_bias)
        return hidden_states, states


class _Stack(layers.Module):
    """``FlaxT5Stack`` as the encoder (the scope ``encoder``): the blocks, then ``final_layer_norm``. Takes the
    embeddings (the token table is the parent's ``shared``, as in transformers)."""

    sizes: Sizes
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.block = _BlockCollection(self.sizes, dtype=self.dtype)
        self.final_layer_norm = RMSNorm(self.sizes.d_model, eps=self.sizes.eps, dtype=self.dtype)

    def __call__(self, hidden_states: jax.Array, attention_mask: jax.Array,
                 output_hidden_states: bool = False) -> T5EncoderOutput:
        hidden_states, states = self.block(hidden_states, attention_mask, output_hidden_states)
        hidden_states = self.final_layer_norm(hidden_states)
        return T5EncoderOutput(hidden_states, states + (hidden_states,) if output_hidden_states else None)


class T5EncoderModel(FromDiffusersConfig, layers.Module):
    """T5's encoder: transformers' ``FlaxT5EncoderModel`` (module docstring).

    The fields up to ``is_gated_act`` are T5Config's config.json keys that change the computation, with
    transformers' defaults (build it with :meth:`from_config`, which fills ``dense_act_fn`` and ``is_gated_act``
    from ``feed_forward_proj`` where the config leaves them out; other known transformers keys change nothing and
    are skipped, unknown ones refused). Built directly, a None ``dense_act_fn`` / ``is_gated_act`` is derived the
    same way. ``dtype`` is the computation's dtype (parameters are float32; the RMS norms compute in float32).

    ``__call__(input_ids, attention_mask=None, output_hidden_states=False)`` -> :class:`T5EncoderOutput`; the mask
    (1: a token, 0: padding not attended to) defaults to ones, as transformers' wrapper sets it."""

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    dense_act_fn: Optional[str] = None
    is_gated_act: Optional[bool] = None
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "T5"
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = CONFIG_IGNORED

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a T5Config config.json (a dict); ``kwargs``: ``dtype``. ValueError for a config it
        cannot run (another ``model_type``, an unknown key or activation, sizes that are no positive integers)."""
        if config.get("model_type", "t5") != "t5":
            raise ValueError(f"T5 config has model_type {config.get('model_type')!r}, not 't5'")
        filled = dict(config)
        for alias, key in ALIASES.items():
            if alias in filled:
                filled[key] = filled.pop(alias)
        activation, gated = feed_forward_kind(filled.get("feed_forward_proj", CONFIG_DEFAULTS["feed_forward_proj"]))
        filled.setdefault("dense_act_fn", activation)
        filled.setdefault("is_gated_act", gated)
        return super().from_config(filled, **kwargs)

    @property
    def config(self) -> Config:
        """The config.json keys and their values (what :meth:`from_config` reads), readable as attributes, and by
        T5Config's other names too (``config.hidden_size`` is ``d_model``)."""
        return _T5Config({k: getattr(self, k) for k in self.CONFIG_DEFAULTS})

    @property
    def sizes(self) -> Sizes:
        """What the layers read: the config with ``dense_act_fn`` and ``is_gated_act`` filled in."""
        activation, gated = feed_forward_kind(self.feed_forward_proj)
        return Sizes(self.d_model, self.d_kv, self.d_ff, self.num_layers, self.num_heads,
                     self.relative_attention_num_buckets, self.relative_attention_max_distance,
                     self.layer_norm_epsilon, activation if self.dense_act_fn is None else self.dense_act_fn,
                     gated if self.is_gated_act is None else bool(self.is_gated_act))

    def check(self) -> None:
        """ValueError for a config this module cannot compute: sizes that are no positive integers, fewer than 4
        buckets (none would be exact: transformers divides by zero), an activation transformers' Flax T5 does not
        have."""
        problems = []
        for key in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                    "relative_attention_num_buckets", "relative_attention_max_distance"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{key} {value!r} is no positive integer")
            elif key == "relative_attention_num_buckets" and value < 4:
                problems.append(f"relative_attention_num_buckets {value} leaves no exact bucket (at least 4)")
        eps = self.layer_norm_epsilon
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
            problems.append(f"layer_norm_epsilon {eps!r} is no non-negative number")
        if self.is_gated_act is not None and not isinstance(self.is_gated_act, bool):
            problems.append(f"is_gated_act {self.is_gated_act!r} is no boolean")
        try:
            activation = self.sizes.activation
        except ValueError as exc:
            problems.append(str(exc).removeprefix("T5 config: "))
        else:
            if activation not in ACTIVATIONS:
                problems.append(f"dense_act_fn {activation!r} is none of {', '.join(sorted(ACTIVATIONS))}")
        if problems:
            raise ValueError(f"T5 config: {'; '.join(problems)}")

    def setup(self) -> None:
        self.shared = layers.Embed(self.vocab_size, self.d_model, embedding_init=jax.nn.initializers.normal(1.0),
                               dtype=self.dtype)
        self.encoder = _Stack(self.sizes, dtype=self.dtype)

    def __call__(self, input_ids: Any, attention_mask: Any = None, output_hidden_states: bool = False
                 ) -> T5EncoderOutput:
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        input_ids = jnp.array(input_ids, dtype="i4")
        attention_mask = jnp.array(attention_mask, dtype="i4")
        return self.encoder(self.shared(input_ids), attention_mask, output_hidden_states)

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` key), transformers' for the same key (its init splits the key
        and traces a (1, 1) input); ``jax.eval_shape(module.init_weights, key)`` costs nothing."""
        params_rng, dropout_rng = jax.random.split(rng)
        input_ids = jnp.zeros((1, 1), dtype="i4")
        return self.init({"params": params_rng, "dropout": dropout_rng}, input_ids,
                         jnp.ones_like(input_ids))["params"]

