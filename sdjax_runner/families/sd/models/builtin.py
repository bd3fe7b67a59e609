"""The SD family's built-in models (models/builtin.py builds them): ``tiny-random`` / ``tiny-random-xl``,
structurally complete SD 1.x / SDXL pipelines small enough to run on a laptop CPU in seconds; ``sd-v1-arch`` /
``sdxl-arch``, the exact SD 1.x and SDXL-base shapes (859.5M and 2.57G UNet parameters) with random weights;
``tiny-random-inpaint``, ``tiny-random`` as an inpainting model; ``tiny-random-controlnet``, a ControlNet for
``tiny-random``. Written in diffusers' and transformers' published layout (models/published_layout.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from sdjax_runner.models.builtin_parts import (
    CLIP_L,
    SEED,
    Builtin,
    clip_text_config,
    clip_vocabulary,
    module_and_shapes,
    random_params,
    write_clip_tokenizer,
)

# SD 1.x's scheduler settings (PNDM, as CompVis/stable-diffusion-v1-4 ships it).
SD_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                    skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
# SDXL-base's (Euler, as stabilityai/stable-diffusion-xl-base-1.0 ships it).
XL_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                    timestep_spacing="leading", prediction_type="epsilon")

SD_VAE = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32)

SPECS: dict[str, dict[str, Any]] = {
    "tiny-random": dict(
        xl=False,
        text=[dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)],
        # Same block structure as SD 1.x (cross-attention down/up blocks around a cross-attention
        # mid block), with 2 resolution levels and few channels.
        unet=dict(sample_size=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=(32, 64),
                  layers_per_block=1, attention_head_dim=8, cross_attention_dim=32),
        # Four levels = 8x spatial down-sampling, as in SD, so height/width mean the same thing.
        vae=dict(block_out_channels=(16, 16, 32, 32), layers_per_block=1, norm_num_groups=8, sample_size=64),
        save_dtype="float32",
    ),
    "tiny-random-xl": dict(
        xl=True,
        text=[dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
              dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   hidden_act="gelu", projection_dim=32)],
        # SDXL's structure (no attention at the top level, several transformer layers deeper down,
        # linear projections, text_time added conditioning) at toy width.
        unet=dict(sample_size=8, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(32, 64),
                  layers_per_block=1, attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2),
                  cross_attention_dim=64, use_linear_projection=True, addition_embed_type="text_time",
                  addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8),
        vae=dict(block_out_channels=(16, 16, 32, 32), layers_per_block=1, norm_num_groups=8, sample_size=64,
                 scaling_factor=0.13025),
        save_dtype="float32",
    ),
    "sd-v1-arch": dict(
        xl=False,
        text=[dict(CLIP_L, vocab_size=49408)],
        unet=dict(sample_size=64, block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                  attention_head_dim=8, cross_attention_dim=768),
        vae=dict(SD_VAE, sample_size=512),
        save_dtype="bfloat16",
    ),
    "sdxl-arch": dict(
        xl=True,
        text=[dict(CLIP_L, vocab_size=49408),
              dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                   hidden_act="gelu", projection_dim=1280, vocab_size=49408)],
        unet=dict(sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                  block_out_channels=(320, 640, 1280), layers_per_block=2, attention_head_dim=(5, 10, 20),
                  transformer_layers_per_block=(1, 2, 10), cross_attention_dim=2048, use_linear_projection=True,
                  addition_embed_type="text_time", addition_time_embed_dim=256,
                  projection_class_embeddings_input_dim=2816),
        vae=dict(SD_VAE, sample_size=1024, scaling_factor=0.13025),
        save_dtype="bfloat16",
    ),
}
# tiny-random as an inpainting model: its UNet reads 9 channels (latents, mask, masked-image latents), as
# runwayml/stable-diffusion-inpainting's does, and its index names StableDiffusionInpaintPipeline.
SPECS["tiny-random-inpaint"] = dict(SPECS["tiny-random"], inpaint=True)
# A ControlNet for a built-in model (controlnet.model=NAME): the down blocks and mid block of its UNet, and a
# conditioning embedding that brings the control image down 8x to the latents' size.
CONTROLNET_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-controlnet": dict(base="tiny-random", conditioning_embedding_out_channels=(16, 16, 32, 32)),
}


def _unet_config(spec: dict) -> dict:
    from sdjax_runner.families.sd.models.unet import CONFIG_DEFAULTS

    return dict(CONFIG_DEFAULTS, in_channels=9 if spec.get("inpaint") else 4, out_channels=4, **spec["unet"])


def _vae_config(spec: dict) -> dict:
    from sdjax_runner.models.nn.vae import CONFIG_DEFAULTS
    from sdjax_runner.models.published_layout import FLAX_VAE_KEYS

    return dict({key: CONFIG_DEFAULTS[key] for key in FLAX_VAE_KEYS}, in_channels=3, out_channels=3,
                latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, **spec["vae"])


def _text_encoders(spec: dict) -> list[tuple[str, str, dict]]:
    """(component, published class, config) of an SD built-in's text encoders."""
    size = len(clip_vocabulary()[0])  # the tokenizer's ids end with <|startoftext|>, <|endoftext|>
    return [("text_encoder" if number == 0 else "text_encoder_2",
             "CLIPTextModelWithProjection" if spec["xl"] and number == 1 else "CLIPTextModel",
             clip_text_config(text, size)) for number, text in enumerate(spec["text"])]


def architecture(name: str):
    """(the runner's modules of built-in ``name``'s pipeline, their parameter shapes), with no weights."""
    spec = SPECS[name]
    classes = {component: (cls, config) for component, cls, config in _text_encoders(spec)}
    classes["unet"] = ("UNet2DConditionModel", _unet_config(spec))
    classes["vae"] = ("AutoencoderKL", _vae_config(spec))
    built = {component: module_and_shapes(cls, config) for component, (cls, config) in classes.items()}
    return ({component: module for component, (module, _) in built.items()},
            {component: shapes for component, (_, shapes) in built.items()})


def sd_weights(spec: dict, shapes: dict) -> dict:
    """An SD built-in's random weights for its components' ``shapes`` (architecture's), drawn from fixed seeds."""
    import ml_dtypes
    import numpy as np

    full_size = spec["save_dtype"] != "float32"
    dtype = np.dtype(ml_dtypes.bfloat16) if spec["save_dtype"] == "bfloat16" else np.dtype(np.float32)
    params = {
        component: random_params(shapes[component], SEED + number, dtype, "float32" if full_size else "float64")
        for number, component in enumerate(["text_encoder", "unet", "vae", "text_encoder_2"]) if component in shapes
    }
    for number, component in enumerate(["text_encoder", "text_encoder_2"]):
        # CLIP's final layer norm has a bias; with none, every token's output would have mean zero, and so
        # would a chunk's -- which A1111's emphasis divides by (engine/encode.py: emphasis).
        if component in params:
            norm = params[component]["text_model"]["final_layer_norm"]
            norm["bias"] = (0.1 * np.random.default_rng(SEED + 30 + number).standard_normal(norm["bias"].shape)
                            ).astype(dtype)
    return params


def _build_into(directory: Path, spec: dict) -> None:
    from sdjax_runner.models import published_layout

    name = next(n for n, s in SPECS.items() if s is spec)
    write_clip_tokenizer(directory / "tokenizer")
    _, shapes = architecture(name)
    params = sd_weights(spec, shapes)
    for component, cls, config in _text_encoders(spec):
        published_layout.transformers_model(directory / component, cls, config, params[component])
    published_layout.diffusers_component(directory / "unet", "FlaxUNet2DConditionModel", _unet_config(spec),
                                         params["unet"])
    published_layout.diffusers_component(directory / "vae", "FlaxAutoencoderKL", _vae_config(spec), params["vae"])
    components: dict[str, list[Any]] = {"text_encoder": ["transformers", "FlaxCLIPTextModel"],
                                        "tokenizer": ["transformers", "CLIPTokenizer"],
                                        "unet": ["diffusers", "FlaxUNet2DConditionModel"],
                                        "vae": ["diffusers", "FlaxAutoencoderKL"]}
    if spec["xl"]:
        write_clip_tokenizer(directory / "tokenizer_2", pad_token="!")  # SDXL's second tokenizer pads with "!"
        published_layout.scheduler(directory / "scheduler", "FlaxEulerDiscreteScheduler", XL_SCHEDULER)
        components.update(scheduler=["diffusers", "FlaxEulerDiscreteScheduler"],
                          text_encoder_2=["transformers", "FlaxCLIPTextModelWithProjection"],
                          tokenizer_2=["transformers", "CLIPTokenizer"])
        pipeline = "FlaxStableDiffusionXLPipeline"
    else:
        published_layout.scheduler(directory / "scheduler", "FlaxPNDMScheduler", SD_SCHEDULER)
        components.update(scheduler=["diffusers", "FlaxPNDMScheduler"], safety_checker=[None, None],
                          feature_extractor=[None, None])
        pipeline = "FlaxStableDiffusionInpaintPipeline" if spec.get("inpaint") else "FlaxStableDiffusionPipeline"
    published_layout.model_index(directory, pipeline, components)


def _controlnet_config(name: str) -> dict:
    from sdjax_runner.families.sd.models.controlnet import CONFIG_DEFAULTS

    spec = CONTROLNET_SPECS[name]
    unet = SPECS[spec["base"]]["unet"]
    return dict(CONFIG_DEFAULTS, sample_size=unet["sample_size"], in_channels=4,
                down_block_types=unet["down_block_types"], block_out_channels=unet["block_out_channels"],
                layers_per_block=unet["layers_per_block"], attention_head_dim=unet["attention_head_dim"],
                cross_attention_dim=unet["cross_attention_dim"],
                conditioning_embedding_out_channels=spec["conditioning_embedding_out_channels"])


def controlnet_architecture(name: str):
    """(the runner's ControlNet module, its parameter shapes) of built-in ControlNet ``name``, with no weights."""
    return module_and_shapes("ControlNetModel", _controlnet_config(name))


def _build_controlnet_into(directory: Path, spec: dict) -> None:
    from sdjax_runner.models import published_layout

    name = next(n for n, s in CONTROLNET_SPECS.items() if s is spec)
    _, shapes = controlnet_architecture(name)
    published_layout.diffusers_component(directory, "FlaxControlNetModel", _controlnet_config(name),
                                         random_params(shapes, SEED + 20))


BUILDS = {**{name: Builtin(functools.partial(_build_into, spec=spec)) for name, spec in SPECS.items()},
          **{name: Builtin(functools.partial(_build_controlnet_into, spec=spec), "controlnet")
             for name, spec in CONTROLNET_SPECS.items()}}
