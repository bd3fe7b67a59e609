"""SD 3's built-in models (models/builtin.py builds them): ``tiny-random-sd3``, a structurally complete SD 3.5
Medium-shaped pipeline in diffusers' layout, and ``sd3.5-large-arch``, SD 3.5 Large's exact shapes with random
weights. Their VAE and T5 are FLUX.1's built-ins' (families/flux/models/builtin.py)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from sdjax_runner.families.flux.models.builtin import FLUX_SPECS
from sdjax_runner.models.builtin_parts import (
    CLIP_L,
    SEED,
    Builtin,
    clip_vocabulary,
    random_params,
    save_clip_text,
    save_flow_scheduler,
    save_own,
    save_t5,
    saved_dtypes,
    write_clip_tokenizer,
    write_t5_tokenizer,
)

# SD 3 / 3.5 pipelines (families/sd3/models/): each component's config.json, as diffusers writes them (the sizes of
# tests/fixtures/sd3/tiny-sd3, the PyTorch reference's: SD 3.5 Medium's shape).
SD3_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-sd3": dict(
        transformer=dict(sample_size=16, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=8,
                         num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32,
                         pooled_projection_dim=24, out_channels=16, pos_embed_max_size=16,
                         dual_attention_layers=[0, 1], qk_norm="rms_norm"),
        vae=dict(FLUX_SPECS["tiny-random-flux"]["vae"], scaling_factor=1.5305, shift_factor=0.0609),
        clip=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                  hidden_act="quick_gelu", projection_dim=8),
        clip_2=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                    hidden_act="gelu", projection_dim=16),
        t5=FLUX_SPECS["tiny-random-flux"]["t5"],
        # stabilityai/stable-diffusion-3.5-medium's scheduler/scheduler_config.json
        scheduler=dict(num_train_timesteps=1000, shift=3.0),
        save_dtype="float32",
    ),
}
# SD 3.5 Large's exact shapes (stabilityai/stable-diffusion-3.5-large's configs: an 8.06B-parameter MMDiT, CLIP-L,
# OpenCLIP bigG's text tower with its projection, T5-XXL's encoder, SD 3's VAE), random weights in bfloat16
# (about 28 GB written once): speed and memory on an accelerator with no hub (benchmarks/full_size.py, part H).
SD3_SPECS["sd3.5-large-arch"] = dict(
    SD3_SPECS["tiny-random-sd3"],
    transformer=dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                     num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                     pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, dual_attention_layers=[],
                     qk_norm="rms_norm"),
    vae=dict(SD3_SPECS["tiny-random-sd3"]["vae"], block_out_channels=[128, 256, 512, 512], layers_per_block=2,
             norm_num_groups=32, sample_size=1024),
    clip=dict(CLIP_L, vocab_size=49408, projection_dim=768),
    clip_2=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                hidden_act="gelu", projection_dim=1280, vocab_size=49408),
    t5=FLUX_SPECS["flux-dev-arch"]["t5"],
    # stabilityai/stable-diffusion-3.5-large's scheduler/scheduler_config.json
    scheduler=dict(num_train_timesteps=1000, shift=3.0),
    save_dtype="bfloat16",
)


def build_sd3_into(directory: Path, spec: dict) -> None:
    """An SD 3 folder in diffusers' layout: model_index.json, each component's config and weights (the
    transformer's position table the sine-cosine one diffusers saves, not random)."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer, sincos_table
    from sdjax_runner.models.checkpoints import param_shapes

    write_clip_tokenizer(directory / "tokenizer", pad_as_text=True)
    write_clip_tokenizer(directory / "tokenizer_2", pad_as_text=True)
    clip_size = len(clip_vocabulary()[0])
    t5_size = write_t5_tokenizer(directory / "tokenizer_3")
    dtype, draw = saved_dtypes(spec)
    for number, (name, clip_spec) in enumerate((("text_encoder", spec["clip"]), ("text_encoder_2", spec["clip_2"]))):
        save_clip_text(directory, name, "CLIPTextModelWithProjection", clip_spec, clip_size, SEED + 50 + number,
                        dtype, draw)
    save_t5(directory, "text_encoder_3", spec["t5"], t5_size, SEED + 52, dtype, draw)
    own: tuple[tuple[str, Any, str], ...] = (("transformer", FlaxSD3Transformer, "SD3Transformer2DModel"),
                                             ("vae", FlaxFluxAutoencoderKL, "AutoencoderKL"))
    for number, (name, cls, class_name) in enumerate(own):
        module = cls.from_config(spec[name])
        tables = {("pos_embed", "pos_embed"): sincos_table(module.inner_dim, module.pos_embed_max_size,
                                                           module.sample_size // module.patch_size)
                  } if name == "transformer" else None
        save_own(directory, name, class_name, spec[name],
                  random_params(param_shapes(module, "diffusers"), SEED + 53 + number, dtype, draw, tables))
    save_flow_scheduler(directory, spec["scheduler"])
    index = {"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.39.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_3": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
             "tokenizer_2": ["transformers", "CLIPTokenizer"], "tokenizer_3": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    (directory / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


# SD 3 ControlNets for tiny-random-sd3 (controlnet.model=NAME, mode=controlnet): diffusers' SD3ControlNetModel of its
# transformer's widths, two blocks against its three (the first two blocks read the residuals), the zero-initialised
# projections random like the rest (else they add nothing). InstantX's kind (joint blocks reading the prompt, a
# position embedding of its own, zero pooled text, no VAE shift on the control image) and SD 3.5 Large's (single
# blocks, no text, the transformer's position embedding, the pooled text and the VAE's shift).
SD3_CONTROLNET_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-sd3-controlnet": dict(num_layers=2),
    "tiny-random-sd3-controlnet-single": dict(num_layers=2, joint_attention_dim=None, use_pos_embed=False,
                                              pos_embed_max_size=None, pos_embed_type=None, dual_attention_layers=[],
                                              qk_norm=None, force_zeros_for_pooled_projection=False),
    # ... and an inpainting one (alimama-creative/SD3-Controlnet-Inpainting's kind: the mask as one more input channel;
    # mode=controlnet_inpaint)
    "tiny-random-sd3-controlnet-inpaint": dict(num_layers=2, extra_conditioning_channels=1)}


def build_sd3_controlnet_into(directory: Path, spec: dict) -> None:
    """An SD 3 ControlNet folder as diffusers' layout holds a Flax component: config.json and weights (a position
    table, where it has one, the sine-cosine one diffusers saves)."""
    from sdjax_runner.families.sd3.models.controlnet import CONFIG_DEFAULTS, FlaxSD3ControlNet
    from sdjax_runner.families.sd3.models.transformer import sincos_table
    from sdjax_runner.models import published_layout
    from sdjax_runner.models.checkpoints import param_shapes

    transformer = SD3_SPECS["tiny-random-sd3"]["transformer"]
    config = {**CONFIG_DEFAULTS, **{k: v for k, v in transformer.items() if k in CONFIG_DEFAULTS}, **spec}
    module = FlaxSD3ControlNet.from_config(config)
    tables = {("pos_embed", "pos_embed"): sincos_table(module.inner_dim, module.pos_embed_max_size,
                                                       module.sample_size // module.patch_size)
              } if module.use_pos_embed else None
    params = random_params(param_shapes(module, "diffusers"), SEED + 70, fixed=tables)
    published_layout.diffusers_component(directory, "SD3ControlNetModel", config, params)


BUILDS = {**{name: Builtin(functools.partial(build_sd3_into, spec=spec)) for name, spec in SD3_SPECS.items()},
          **{name: Builtin(functools.partial(build_sd3_controlnet_into, spec=spec), "controlnet")
             for name, spec in SD3_CONTROLNET_SPECS.items()}}
