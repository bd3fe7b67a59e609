"""FLUX.2 [klein]'s built-in models (models/builtin.py builds them): ``tiny-random-flux2`` (distilled) and
``tiny-random-flux2-base`` (classifier-free guidance), structurally complete Flux2KleinPipeline folders in diffusers'
layout at the sizes of tests/fixtures/flux2/tiny-flux2-klein (a byte-level BPE tokenizer with Qwen's special tokens, a
28-layer toy Qwen3, the transformer, the VAE with its batch-norm statistics, the scheduler config), and
``flux2-klein-4b-arch`` / ``flux2-klein-9b-arch``, the published shapes with random weights."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from sdjax_runner.models.builtin_parts import (
    CORPUS,
    SEED,
    Builtin,
    random_params,
    save_flow_scheduler,
    save_own,
    saved_dtypes,
)

# Qwen's special tokens (after the vocabulary, in this order) and Qwen3's added thinking tokens
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINKING = ("<think>", "</think>")
TOKENIZER_VOCAB = 400  # the byte alphabet (256) and the merges learned from the built-in corpus
# The part of Qwen3's chat template one user message renders (tokenizer/chat_template.jinja, for other tools: the runner
# writes the same text itself, models/nn/qwen_tokenizer.chat_text, and runs no template)
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                 "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                 "{%- if enable_thinking is defined and enable_thinking is false %}"
                 "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")

TINY: dict[str, Any] = dict(
    transformer=dict(patch_size=1, in_channels=32, out_channels=None, num_layers=1, num_single_layers=2,
                     attention_head_dim=16, num_attention_heads=2, joint_attention_dim=96,
                     timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=[4, 4, 4, 4], rope_theta=2000,
                     eps=1e-6, guidance_embeds=False),
    vae=dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
             up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[4, 8, 8, 8], decoder_block_out_channels=None,
             layers_per_block=1, act_fn="silu", latent_channels=8, norm_num_groups=2, sample_size=32,
             force_upcast=True, use_quant_conv=True, use_post_quant_conv=True, mid_block_add_attention=True,
             batch_norm_eps=1e-4, batch_norm_momentum=0.1, patch_size=[2, 2]),
    qwen3=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=28, num_attention_heads=4, num_key_value_heads=2,
               head_dim=8, max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu",
               tie_word_embeddings=True, attention_bias=False, use_sliding_window=False, rope_scaling=None),
    # black-forest-labs/FLUX.2-klein-4B's scheduler/scheduler_config.json values
    scheduler=dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                   base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential"),
    distilled=True,
    save_dtype="float32",
)
FLUX2_SPECS: dict[str, dict[str, Any]] = {"tiny-random-flux2": TINY, "tiny-random-flux2-base": dict(TINY, distilled=False)}
# The published shapes (black-forest-labs/FLUX.2-klein-4B, -9B: transformer/, text_encoder/ (Qwen3-4B, Qwen3-8B),
# vae/ config.json), random weights in bfloat16: speed and memory on an accelerator with no hub.
_FULL_VAE = dict(TINY["vae"], block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=32,
                 norm_num_groups=32, sample_size=1024)
_FULL_TRANSFORMER = dict(TINY["transformer"], in_channels=128, attention_head_dim=128, axes_dims_rope=[32, 32, 32, 32])
_QWEN3 = dict(TINY["qwen3"], num_hidden_layers=36, num_key_value_heads=8, num_attention_heads=32, head_dim=128,
              max_position_embeddings=40960, vocab_size=151936)
FLUX2_SPECS["flux2-klein-4b-arch"] = dict(
    TINY, vae=_FULL_VAE, save_dtype="bfloat16",
    transformer=dict(_FULL_TRANSFORMER, num_layers=5, num_single_layers=20, num_attention_heads=24,
                     joint_attention_dim=7680),
    qwen3=dict(_QWEN3, hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True))
FLUX2_SPECS["flux2-klein-9b-arch"] = dict(
    TINY, vae=_FULL_VAE, save_dtype="bfloat16",
    transformer=dict(_FULL_TRANSFORMER, num_layers=8, num_single_layers=24, num_attention_heads=32,
                     joint_attention_dim=12288),
    qwen3=dict(_QWEN3, hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False))


def tokenizer_model() -> Any:
    """The built-in Qwen-style tokenizer (a ``tokenizers.Tokenizer``): a byte-level BPE learned from the built-in
    corpus, then Qwen's special tokens and Qwen3's thinking tokens as added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS.split("\n"), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in THINKING])
    return tokenizer


def write_tokenizer(directory: Path) -> int:
    """``tokenizer/`` as Qwen2TokenizerFast saves it (tokenizer.json, tokenizer_config.json, chat_template.jinja); returns the vocabulary
    size, added tokens included."""
    tokenizer = tokenizer_model()
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    decoder = {str(tokenizer.token_to_id(token)): dict(content=token, lstrip=False, normalized=False, rstrip=False,
                                                       single_word=False, special=token in SPECIAL)
               for token in (*SPECIAL, *THINKING)}
    config = {"added_tokens_decoder": decoder, "additional_special_tokens": list(SPECIAL[1:]), "bos_token": None,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
              "model_max_length": 131072, "clean_up_tokenization_spaces": False, "tokenizer_class": "Qwen2Tokenizer"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return tokenizer.get_vocab_size(with_added_tokens=True)


def save_qwen3(directory: Path, config: dict, vocab_size: int, seed: int, dtype: Any, draw: str) -> None:
    """``text_encoder/``: a Qwen3ForCausalLM config.json and the runner's Qwen3 weights (its Flax file), random."""
    from flax.serialization import to_bytes

    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.nn.qwen3 import Qwen3TextModel

    full = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size, **config}
    module = Qwen3TextModel.from_config(full)
    (directory / "text_encoder").mkdir()
    (directory / "text_encoder" / "config.json").write_text(json.dumps(full, indent=2), encoding="utf-8")
    params = random_params(param_shapes(module, "diffusers"), seed, dtype, draw)
    (directory / "text_encoder" / "flax_model.msgpack").write_bytes(to_bytes(params))


def build_flux2_into(directory: Path, spec: dict) -> None:
    """A FLUX.2 [klein] folder in diffusers' layout: model_index.json, each component's config and weights."""
    from sdjax_runner.families.flux2.models.autoencoder import FlaxFlux2AutoencoderKL
    from sdjax_runner.families.flux2.models.pipeline import index_json
    from sdjax_runner.families.flux2.models.transformer import FlaxFlux2Transformer
    from sdjax_runner.models.checkpoints import param_shapes

    dtype, draw = saved_dtypes(spec)
    size = write_tokenizer(directory / "tokenizer")
    vocab = spec["qwen3"].get("vocab_size") or -(-size // 16) * 16
    save_qwen3(directory, {k: v for k, v in spec["qwen3"].items() if k != "vocab_size"}, vocab, SEED + 70, dtype, draw)
    own: tuple[tuple[str, Any, str], ...] = (("transformer", FlaxFlux2Transformer, "Flux2Transformer2DModel"),
                                             ("vae", FlaxFlux2AutoencoderKL, "AutoencoderKLFlux2"))
    for number, (name, cls, class_name) in enumerate(own):
        shapes = param_shapes(cls.from_config(spec[name]), "diffusers")
        params = random_params(shapes, SEED + 71 + number, dtype, draw, batch_statistics(shapes) if name == "vae" else None)
        save_own(directory, name, class_name, spec[name], params)
    save_flow_scheduler(directory, spec["scheduler"])
    (directory / "model_index.json").write_text(index_json(distilled=spec["distilled"]), encoding="utf-8")


def batch_statistics(shapes: Any) -> dict:
    """The VAE's batch-norm statistics as a trained VAE has them (tables, not weights, for random_params): means
    about 0, variances about 1."""
    import numpy as np

    rng = np.random.default_rng(SEED + 73)
    channels = shapes["bn"]["running_mean"].shape
    return {("bn", "running_mean"): 0.3 * rng.standard_normal(channels),
            ("bn", "running_var"): 0.5 + rng.uniform(size=channels)}


BUILDS = {name: Builtin(functools.partial(build_flux2_into, spec=spec)) for name, spec in FLUX2_SPECS.items()}
