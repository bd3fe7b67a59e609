"""FLUX.1's built-in models (models/builtin.py builds them): ``tiny-random-flux`` and ``tiny-random-flux-schnell``,
structurally complete FLUX.1 [dev] / [schnell] pipelines in diffusers' layout (CLIP tokenizer and text encoder, a
T5 tokenizer and encoder, the flow-matching transformer, the 16-channel VAE, the scheduler config), and
``flux-dev-arch``, FLUX.1 [dev]'s exact shapes with random weights."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

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

# FLUX.1 pipelines (families/flux/models/): each component's config.json, as diffusers writes them (the sizes of
# tests/fixtures/flux/tiny-flux-dev, the PyTorch reference's).
FLUX_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-flux": dict(
        transformer=dict(patch_size=1, in_channels=64, out_channels=None, num_layers=1, num_single_layers=2,
                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                         pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=[4, 6, 6]),
        vae=dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                 up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[4, 8, 8, 8], layers_per_block=1,
                 act_fn="silu", latent_channels=16, norm_num_groups=2, sample_size=32, scaling_factor=0.3611,
                 shift_factor=0.1159, latents_mean=None, latents_std=None, force_upcast=True,
                 use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True),
        clip=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        t5=dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
                relative_attention_num_buckets=32, relative_attention_max_distance=128),
        # FLUX.1-dev's scheduler config (black-forest-labs/FLUX.1-dev, scheduler/scheduler_config.json)
        scheduler=dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                       max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
        save_dtype="float32",
    ),
}
# FLUX.1 [schnell]'s structure at toy size: no guidance embedder, and schnell's scheduler config
# (black-forest-labs/FLUX.1-schnell, scheduler/scheduler_config.json: shift 1, no dynamic shifting).
FLUX_SPECS["tiny-random-flux-schnell"] = dict(
    FLUX_SPECS["tiny-random-flux"],
    transformer=dict(FLUX_SPECS["tiny-random-flux"]["transformer"], guidance_embeds=False),
    scheduler=dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5, max_shift=1.15,
                   base_image_seq_len=256, max_image_seq_len=4096),
)
# FLUX.1 Kontext [dev] at toy size: tiny-random-flux's folder with the index naming FluxKontextPipeline (Kontext is
# [dev]'s architecture; the pipeline class says it reads an input image: mode=edit)
FLUX_SPECS["tiny-random-flux-kontext"] = dict(FLUX_SPECS["tiny-random-flux"], pipeline_class="FluxKontextPipeline")
# FLUX.1 Fill [dev] at toy size: tiny-random-flux with Fill's transformer shape -- after the packed latents (64) the
# masked image's packed latents (64) and the mask's 8 x 8 pixels per latent pixel, packed (256): 384 channels in, 64
# out -- and the index naming FluxFillPipeline (mode=inpaint)
FLUX_SPECS["tiny-random-flux-fill"] = dict(
    FLUX_SPECS["tiny-random-flux"], pipeline_class="FluxFillPipeline",
    transformer=dict(FLUX_SPECS["tiny-random-flux"]["transformer"], in_channels=384, out_channels=64))
# FLUX.1 Canny/Depth [dev] at toy size: tiny-random-flux with their transformer shape -- after the packed latents (64)
# the control image's packed latents (64): 128 channels in, 64 out -- and the index naming FluxControlPipeline
# (mode=control)
FLUX_SPECS["tiny-random-flux-control"] = dict(
    FLUX_SPECS["tiny-random-flux"], pipeline_class="FluxControlPipeline",
    transformer=dict(FLUX_SPECS["tiny-random-flux"]["transformer"], in_channels=128, out_channels=64))
# FLUX.1 [dev]'s exact shapes (black-forest-labs/FLUX.1-dev's configs: an 11.9B-parameter transformer, CLIP-L,
# T5-XXL's 4.8B-parameter encoder, the 16-channel VAE), random weights in bfloat16 (about 34 GB written once):
# speed and memory on an accelerator with no hub.
FLUX_SPECS["flux-dev-arch"] = dict(
    FLUX_SPECS["tiny-random-flux"],
    transformer=dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                     attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                     pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=[16, 56, 56]),
    vae=dict(FLUX_SPECS["tiny-random-flux"]["vae"], block_out_channels=[128, 256, 512, 512], layers_per_block=2,
             norm_num_groups=32, sample_size=1024),
    clip=dict(CLIP_L, vocab_size=49408),
    t5=dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, feed_forward_proj="gated-gelu",
            relative_attention_num_buckets=32, relative_attention_max_distance=128, vocab_size=32128),
    save_dtype="bfloat16",
)


def build_flux_into(directory: Path, spec: dict) -> None:
    """A FLUX.1 folder in diffusers' layout: model_index.json, each component's config and weights."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer
    from sdjax_runner.models.checkpoints import param_shapes

    write_clip_tokenizer(directory / "tokenizer", pad_as_text=True)
    clip_size = len(clip_vocabulary()[0])
    t5_size = write_t5_tokenizer(directory / "tokenizer_2")
    dtype, draw = saved_dtypes(spec)
    save_clip_text(directory, "text_encoder", "CLIPTextModel", spec["clip"], clip_size, SEED + 40, dtype, draw)
    save_t5(directory, "text_encoder_2", spec["t5"], t5_size, SEED + 41, dtype, draw)
    own: tuple[tuple[str, Any, str], ...] = (("transformer", FlaxFluxTransformer, "FluxTransformer2DModel"),
                                             ("vae", FlaxFluxAutoencoderKL, "AutoencoderKL"))
    for number, (name, cls, class_name) in enumerate(own):
        module = cls.from_config(spec[name])
        save_own(directory, name, class_name, spec[name],
                  random_params(param_shapes(module, "diffusers"), SEED + 42 + number, dtype, draw))
    save_flow_scheduler(directory, spec["scheduler"])
    index = {"_class_name": spec.get("pipeline_class", "FluxPipeline"), "_diffusers_version": "0.39.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    (directory / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


# A FLUX.1 ControlNet for a built-in model (controlnet.model=NAME, mode=controlnet): diffusers' FluxControlNetModel
# of its transformer's widths, one double block and one single block (against its transformer's one and two: each
# single block reads the one residual), its zero-initialised projections random like the rest (else it adds nothing)
FLUX_CONTROLNET_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-flux-controlnet": dict(base="tiny-random-flux", num_layers=1, num_single_layers=1),
    # ... and a union one (InstantX's Union's kind: its control modes, 7 as theirs; controlnet.control_mode)
    "tiny-random-flux-controlnet-union": dict(base="tiny-random-flux", num_layers=1, num_single_layers=1, num_mode=7)}


def build_flux_controlnet_into(directory: Path, spec: dict) -> None:
    """A FLUX.1 ControlNet folder as diffusers' layout holds a Flax component: config.json and weights."""
    from sdjax_runner.families.flux.models.controlnet import CONFIG_DEFAULTS, FlaxFluxControlNet
    from sdjax_runner.models import published_layout
    from sdjax_runner.models.checkpoints import param_shapes

    transformer = FLUX_SPECS[spec["base"]]["transformer"]
    config = {**CONFIG_DEFAULTS, **{k: v for k, v in transformer.items() if k in CONFIG_DEFAULTS},
              "num_layers": spec["num_layers"], "num_single_layers": spec["num_single_layers"],
              "num_mode": spec.get("num_mode")}
    shapes = param_shapes(FlaxFluxControlNet.from_config(config), "diffusers")
    published_layout.diffusers_component(directory, "FluxControlNetModel", config, random_params(shapes, SEED + 60))


BUILDS = {**{name: Builtin(functools.partial(build_flux_into, spec=spec)) for name, spec in FLUX_SPECS.items()},
          **{name: Builtin(functools.partial(build_flux_controlnet_into, spec=spec), "controlnet")
             for name, spec in FLUX_CONTROLNET_SPECS.items()}}
