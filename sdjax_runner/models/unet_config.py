"""What a UNet's ``config.json`` may ask that diffusers' ``FlaxUNet2DConditionModel`` does not compute.

The Flax UNet takes the keys it knows and ignores the rest (diffusers' ``from_config`` logs them at most), and its
weight conversion skips tensors it has no parameter for: a UNet whose config turns on something the Flax class has
not -- an LCM model's guidance embedding (``time_cond_proj_dim``), class embeddings, another block type, other
normalisation -- would load and run, wrongly, with those weights dropped. :func:`check` refuses such a config in one
line instead. Each key is listed with the value at which diffusers' PyTorch ``UNet2DConditionModel`` computes what
the Flax class computes (its default, or what the Flax class hard-codes); keys that change only precision
(``upcast_attention``, SD 2.1's) are not listed."""

from __future__ import annotations

from typing import Any

# key -> (the values that compute as the Flax UNet does, what the key is)
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "time_cond_proj_dim": ((None,), "an LCM model's guidance embedding (w, added to the time embedding)"),
    "class_embed_type": ((None,), "class embeddings (an upscaler's noise level, unCLIP's image embedding)"),
    "num_class_embeds": ((None,), "class embeddings"),
    "encoder_hid_dim": ((None,), "a projection of the text encoder's states (DeepFloyd IF, Kandinsky)"),
    "encoder_hid_dim_type": ((None,), "a projection of the text encoder's states"),
    "addition_embed_type": ((None, "text_time"), "added embeddings other than SDXL's text_time"),
    "center_input_sample": ((False,), "centring the input sample"),
    "conv_in_kernel": ((3,), "the input convolution's window"),
    "conv_out_kernel": ((3,), "the output convolution's window"),
    "resnet_time_scale_shift": (("default",), "scale-shift time conditioning in the resnets"),
    "time_embedding_type": (("positional",), "Fourier time embeddings"),
    "time_embedding_dim": ((None,), "another time embedding width"),
    "time_embedding_act_fn": ((None,), "an activation on the time embedding"),
    "timestep_post_act": ((None,), "an activation after the time embedding"),
    "act_fn": (("silu",), "another activation"),
    "norm_num_groups": ((32,), "another group-norm group count"),
    "norm_eps": ((1e-5,), "another group-norm epsilon"),
    "attention_type": (("default",), "gated attention (GLIGEN)"),
    "class_embeddings_concat": ((False,), "class embeddings concatenated"),
    "dual_cross_attention": ((False,), "dual cross-attention"),
    "resnet_skip_time_act": ((False,), "the resnets' skipped time activation"),
    "resnet_out_scale_factor": ((1, 1.0), "scaled resnet outputs"),
    "cross_attention_norm": ((None,), "normalised cross-attention inputs"),
    "mid_block_type": (("UNetMidBlock2DCrossAttn",), "another middle block"),
    "reverse_transformer_layers_per_block": ((None,), "per-block transformer depths in the up blocks"),
    "downsample_padding": ((1,), "another downsampling padding"),
    "mid_block_scale_factor": ((1, 1.0), "a scaled middle block"),
}
DOWN_BLOCKS = ("CrossAttnDownBlock2D", "DownBlock2D")
UP_BLOCKS = ("CrossAttnUpBlock2D", "UpBlock2D")


def unsupported(config: dict) -> list[str]:
    """``key=value (what it is)`` for each setting of ``config`` (a UNet's config.json) the Flax UNet does not
    compute; empty where it computes all of it."""
    found = []
    for key, (neutral, what) in NEUTRAL.items():
        if key in config and config[key] not in neutral:
            found.append(f"{key}={config[key]!r} ({what})")
    for key, allowed in (("down_block_types", DOWN_BLOCKS), ("up_block_types", UP_BLOCKS)):
        others = [block for block in config.get(key) or () if block not in allowed]
        if others:
            found.append(f"{key} {others[0]} (the Flax UNet builds {' and '.join(allowed)} only)")
    return found
