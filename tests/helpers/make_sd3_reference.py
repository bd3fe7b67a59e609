"""Make the PyTorch reference fixtures for Stable Diffusion 3 / 3.5 (issue #48) in ``tests/fixtures/sd3/``.

The runner never imports torch. This script runs in the reference environment of
``tests/helpers/make_flux_reference.py`` (the same pinned versions; see its docstring) and builds, with diffusers'
own PyTorch classes and fixed torch seeds, tiny random-weight ``SD3Transformer2DModel`` s in the three published
shapes of the family -- ``sd3`` (SD 3.0 Medium: no q/k norm), ``large`` (SD 3.5 Large: RMS q/k norm) and
``medium`` (SD 3.5 Medium, MMDiT-X: RMS q/k norm and dual attention in its first blocks) -- saves each with
``save_pretrained`` (the published layout: config.json and diffusion_pytorch_model.safetensors) and records what
diffusers computes with them for fixed inputs, all blocks and with a block skipped (skip-layer guidance), in
``transformers.npz``. Running it twice writes identical files.

The LoRA reference also needs peft (0.17.1, recorded in VERSIONS.json) in that environment.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_sd3_reference.py            # writes tests/fixtures/sd3/
    /work/refvenv/bin/python tests/helpers/make_sd3_reference.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import (  # the FLUX maker's helpers and its T5 and VAE shapes, unchanged
    T5,
    VAE,
    _builtin_tokenizer_code,
    _np,
    _save_npz,
    _t5_config,
    _t5_tokenizer,
    _versions,
    runner_noise,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "sd3"
SEED = 0

# SD 3's transformer at toy size: 4 heads of 8, three blocks (the last one context_pre_only), 2x2 patches of the
# 16-channel latents, T5 width 32 (CLIP features are padded to it), pooled CLIP-L + CLIP-G width 24; a 16 x 16
# patch position table (the real ones: 192 for SD 3.5 Large, 384 for Medium), base size sample_size / patch.
TRANSFORMER = dict(sample_size=16, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=8,
                   num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32,
                   pooled_projection_dim=24, out_channels=16, pos_embed_max_size=16)
VARIANTS = {
    "sd3": dict(qk_norm=None, dual_attention_layers=()),
    "large": dict(qk_norm="rms_norm", dual_attention_layers=()),
    "medium": dict(qk_norm="rms_norm", dual_attention_layers=(0, 1)),
}
# Module inputs: NCHW latents of 8 x 12 (4 x 6 patches: a crop off the table's centre, not square), 10 text
# tokens, a timestep on the scheduler's 0..1000 scale, a batch of 2 (different timesteps per row).
LATENT_H, LATENT_W = 8, 12
TEXT_TOKENS = 10
TIMESTEPS = (700.0, 31.5)
SKIP_LAYERS = (1,)


def transformer_references(out: Path) -> None:
    import torch
    from diffusers import SD3Transformer2DModel

    rng = np.random.RandomState(SEED)
    batch = len(TIMESTEPS)
    hidden = rng.standard_normal((batch, TRANSFORMER["in_channels"], LATENT_H, LATENT_W)).astype(np.float32)
    context = rng.standard_normal((batch, TEXT_TOKENS, TRANSFORMER["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((batch, TRANSFORMER["pooled_projection_dim"])).astype(np.float32)
    arrays = {"hidden_states": hidden, "encoder_hidden_states": context, "pooled_projections": pooled,
              "timestep": np.asarray(TIMESTEPS, np.float32)}
    for index, (variant, extra) in enumerate(VARIANTS.items()):
        torch.manual_seed(SEED + index)
        model = SD3Transformer2DModel(**TRANSFORMER, **extra).eval()
        folder = out / f"transformer-{variant}"
        model.save_pretrained(folder, safe_serialization=True)
        with torch.no_grad():
            for name, skip in (("all", None), ("skip", list(SKIP_LAYERS))):
                sample = model(hidden_states=torch.from_numpy(hidden), encoder_hidden_states=torch.from_numpy(context),
                               pooled_projections=torch.from_numpy(pooled), timestep=torch.tensor(TIMESTEPS),
                               skip_layers=skip, return_dict=False)[0]
                arrays[f"{variant}_{name}"] = _np(sample)
    _save_npz(out / "transformers.npz", arrays)


# --- a whole pipeline ----------------------------------------------------------------------------------

PROMPT = "a red cube on a table"
NEGATIVE_PROMPT = "blurry"
HEIGHT = WIDTH = 32  # runner_noise()'s: 2 images, (1, 16, 4, 4) each, from the runner's per-device keys
STEPS = 4
GUIDANCE = 5.0
MAX_SEQUENCE_LENGTH = 32
# Skip-layer guidance as SD 3.5 Medium's model card runs it (layers 7, 8, 9 of 24 there; block 1 of 3 here), its
# window widened so that 2 of the 4 steps use it (diffusers: step i with start * steps < i < stop * steps).
SLG = dict(skip_guidance_layers=[1], skip_layer_guidance_scale=2.8, skip_layer_guidance_start=0.01,
           skip_layer_guidance_stop=0.6)
# The pipeline's transformer: SD 3.5 Medium's shape (RMS q/k norm, dual attention in its first blocks).
PIPELINE_TRANSFORMER = dict(TRANSFORMER, qk_norm="rms_norm", dual_attention_layers=(0, 1))
# The published scheduler_config.json of stabilityai/stable-diffusion-3.5-large and -medium.
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0)
# SD 3's VAE: FLUX.1's architecture with its own scaling and shift factors.
SD3_VAE = dict(VAE, scaling_factor=1.5305, shift_factor=0.0609)
# CLIP ViT-L/14 (quick_gelu) and OpenCLIP bigG/14 (gelu) text towers with projections, at toy width: their
# penultimate states (8 + 16) are padded to the T5 width (32), their projections (8 + 16) make the pooled 24.
CLIP_L = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, hidden_act="quick_gelu",
              projection_dim=8, max_position_embeddings=77)
CLIP_G = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, hidden_act="gelu",
              projection_dim=16, max_position_embeddings=77)
COMPONENT_SEEDS = dict(transformer=10, vae=11, text_encoder=12, text_encoder_2=13, text_encoder_3=14)


def build_pipeline(staging: Path):
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel

    size = _builtin_tokenizer_code()["write_clip_tokenizer"](staging / "clip_tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(staging / "clip_tokenizer")
    t5_tokenizer = _t5_tokenizer(staging)
    special = dict(vocab_size=size, bos_token_id=size - 2, eos_token_id=size - 1, pad_token_id=size - 1)
    modules = {}
    for name, build in (("transformer", lambda: SD3Transformer2DModel(**PIPELINE_TRANSFORMER)),
                        ("vae", lambda: AutoencoderKL(**SD3_VAE)),
                        ("text_encoder", lambda: CLIPTextModelWithProjection(CLIPTextConfig(**special, **CLIP_L))),
                        ("text_encoder_2", lambda: CLIPTextModelWithProjection(CLIPTextConfig(**special, **CLIP_G))),
                        ("text_encoder_3", lambda: T5EncoderModel(_t5_config(t5_tokenizer)))):
        torch.manual_seed(COMPONENT_SEEDS[name])
        modules[name] = build().eval()
    if T5["d_model"] != TRANSFORMER["joint_attention_dim"]:
        raise RuntimeError("the T5 width must be the transformer's joint_attention_dim")
    pipeline = StableDiffusion3Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), tokenizer=tokenizer,
                                        tokenizer_2=tokenizer, tokenizer_3=t5_tokenizer, **modules)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def without_t5(pipeline):
    from diffusers import StableDiffusion3Pipeline

    components = dict(pipeline.components, text_encoder_3=None, tokenizer_3=None)
    reduced = StableDiffusion3Pipeline(**components)
    reduced.set_progress_bar_config(disable=True)
    return reduced


def pipeline_references(pipeline, out: Path) -> None:
    import torch

    latents = runner_noise()
    batch = latents.shape[0]
    calls = {
        "default": (pipeline, {}),
        "negative": (pipeline, {"negative_prompt": [NEGATIVE_PROMPT] * batch}),
        "no_t5": (without_t5(pipeline), {}),
        "slg": (pipeline, SLG),
        "no_cfg": (pipeline, {"guidance_scale": 1.0}),
    }
    arrays: dict[str, np.ndarray] = {"latents": latents, "prompt": np.asarray(PROMPT),
                                     "negative_prompt": np.asarray(NEGATIVE_PROMPT)}
    with torch.no_grad():
        for name, (pipe, extra) in calls.items():
            kwargs = dict(prompt=[PROMPT] * batch, height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                          guidance_scale=GUIDANCE, max_sequence_length=MAX_SEQUENCE_LENGTH,
                          latents=torch.from_numpy(latents), output_type="np")
            kwargs.update(extra)
            arrays[f"{name}_images"] = np.asarray(pipe(**kwargs).images, dtype=np.float32)
        embeds, negative, pooled, negative_pooled = pipeline.encode_prompt(
            PROMPT, PROMPT, PROMPT, negative_prompt=NEGATIVE_PROMPT, max_sequence_length=MAX_SEQUENCE_LENGTH)
        arrays.update(prompt_embeds=_np(embeds), negative_prompt_embeds=_np(negative), pooled_prompt_embeds=_np(pooled),
                      negative_pooled_prompt_embeds=_np(negative_pooled))
        pipeline.scheduler.set_timesteps(STEPS)
        arrays.update(sigmas=_np(pipeline.scheduler.sigmas), timesteps=_np(pipeline.scheduler.timesteps))
    _save_npz(out / "pipeline.npz", arrays)


def stability_layout(state_dict: dict, num_layers: int) -> dict:
    """diffusers' SD3Transformer2DModel state dict in Stability AI's single-file layout (sd3.5_medium.safetensors:
    model.diffusion_model.*): the inverse of diffusers' convert_sd3_transformer_checkpoint_to_diffusers -- q/k/v
    fused, the last block's context modulation and the final modulation halves swapped back to (shift, scale)."""
    import torch

    def unswap(tensor):
        scale, shift = tensor.chunk(2, dim=0)
        return torch.cat([shift, scale], dim=0)

    top = {"pos_embed.pos_embed": "pos_embed", "pos_embed.proj": "x_embedder.proj",
           "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
           "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
           "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
           "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2", "context_embedder": "context_embedder",
           "proj_out": "final_layer.linear", "norm_out.linear": "final_layer.adaLN_modulation.1"}
    block = {"attn.to_out.0": "x_block.attn.proj", "attn.to_add_out": "context_block.attn.proj",
             "attn.norm_q": "x_block.attn.ln_q", "attn.norm_k": "x_block.attn.ln_k",
             "attn.norm_added_q": "context_block.attn.ln_q", "attn.norm_added_k": "context_block.attn.ln_k",
             "attn2.to_out.0": "x_block.attn2.proj", "attn2.norm_q": "x_block.attn2.ln_q",
             "attn2.norm_k": "x_block.attn2.ln_k", "norm1.linear": "x_block.adaLN_modulation.1",
             "norm1_context.linear": "context_block.adaLN_modulation.1", "ff.net.0.proj": "x_block.mlp.fc1",
             "ff.net.2": "x_block.mlp.fc2", "ff_context.net.0.proj": "context_block.mlp.fc1",
             "ff_context.net.2": "context_block.mlp.fc2"}
    fused = {("attn.to_q", "attn.to_k", "attn.to_v"): "x_block.attn.qkv",
             ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"): "context_block.attn.qkv",
             ("attn2.to_q", "attn2.to_k", "attn2.to_v"): "x_block.attn2.qkv"}
    out = {}
    for name, tensor in state_dict.items():
        module, _, leaf = name.rpartition(".")
        if name in top:
            out[top[name]] = tensor
        elif module in top:
            out[f"{top[module]}.{leaf}"] = unswap(tensor) if module == "norm_out.linear" else tensor
        else:
            _, number, rest = name.split(".", 2)
            part = rest.rpartition(".")[0]
            if part in block:
                last = int(number) == num_layers - 1 and part == "norm1_context.linear"
                out[f"joint_blocks.{number}.{block[part]}.{leaf}"] = unswap(tensor) if last else tensor
            elif not any(part in names[1:] for names in fused):  # k and v join q's entry
                names = next(names for names in fused if part == names[0])
                pieces = [state_dict[f"transformer_blocks.{number}.{n}.{leaf}"] for n in names]
                out[f"joint_blocks.{number}.{fused[names]}.{leaf}"] = torch.cat(pieces, dim=0)
    return {f"model.diffusion_model.{k}": v.contiguous() for k, v in out.items()}


def single_file(pipeline, out: Path) -> None:
    """The pipeline's transformer as Stability AI's single file (with a CLIP tensor as the files with their text
    encoders inside carry, which the transformer's loaders leave out), checked by diffusers' own from_single_file:
    it must load back the same weights."""
    import torch
    from diffusers import SD3Transformer2DModel
    from safetensors.torch import save_file

    transformer = pipeline.transformer
    tensors = stability_layout(transformer.state_dict(), transformer.config.num_layers)
    tensors["text_encoders.clip_l.transformer.text_model.final_layer_norm.weight"] = torch.ones(8)
    path = out / "tiny-sd3-transformer.safetensors"
    save_file(tensors, str(path))
    loaded = SD3Transformer2DModel.from_single_file(str(path), config=str(out / "tiny-sd3"), subfolder="transformer",
                                                    local_files_only=True)
    expected, got = transformer.state_dict(), loaded.state_dict()
    if set(expected) != set(got) or any(not torch.equal(expected[k], got[k]) for k in expected):
        raise RuntimeError("diffusers' from_single_file does not load the single file back to the same weights")


def ldm_vae_layout(state_dict: dict, levels: int) -> dict:
    """diffusers' AutoencoderKL state dict in the original (LDM) layout of a single file's ``first_stage_model.*``:
    the inverse of diffusers' convert_ldm_vae_checkpoint -- ``down_blocks.i.resnets.j`` -> ``down.i.block.j``, the
    decoder's ``up_blocks.i`` -> ``up.{levels-1-i}``, ``mid_block`` -> ``mid.block_1/2`` and ``mid.attn_1`` (its
    linear q/k/v/proj_out as 1x1 convolutions), ``conv_norm_out`` -> ``norm_out``, ``conv_shortcut`` ->
    ``nin_shortcut``."""
    import re

    attention = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    out = {}
    for name, tensor in state_dict.items():
        coder, rest = name.split(".", 1)
        new, linear = None, False
        if rest.startswith(("conv_in.", "conv_out.")) or coder in ("quant_conv", "post_quant_conv"):
            new = rest if coder in ("encoder", "decoder") else None
        if rest.startswith("conv_norm_out."):
            new = "norm_out." + rest.removeprefix("conv_norm_out.")
        elif match := re.fullmatch(r"(down|up)_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", rest):
            level = int(match[2]) if match[1] == "down" else levels - 1 - int(match[2])
            new = f"{match[1]}.{level}.block.{match[3]}.{match[4].replace('conv_shortcut', 'nin_shortcut')}"
        elif match := re.fullmatch(r"(down|up)_blocks\.(\d+)\.(down|up)samplers\.0\.(.+)", rest):
            level = int(match[2]) if match[1] == "down" else levels - 1 - int(match[2])
            new = f"{match[1]}.{level}.{match[3]}sample.{match[4]}"
        elif match := re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.+)", rest):
            new = f"mid.block_{int(match[1]) + 1}.{match[2].replace('conv_shortcut', 'nin_shortcut')}"
        elif match := re.fullmatch(r"mid_block\.attentions\.0\.(.+)\.(weight|bias)", rest):
            new, linear = f"mid.attn_1.{attention[match[1]]}.{match[2]}", match[1] != "group_norm"
        if new is None:
            raise RuntimeError(f"no LDM name for the VAE tensor {name}")
        key = f"{coder}.{new}" if coder in ("encoder", "decoder") else name
        out[key] = tensor[:, :, None, None] if linear and tensor.ndim == 2 else tensor
    return out


def all_in_one(pipeline, out: Path) -> None:
    """tiny-sd3 as one file with everything inside, as Stability AI's "incl_clips" files and ComfyUI's saves are:
    the MMDiT (``model.diffusion_model.*``), CLIP-L, CLIP-G and T5 under ``text_encoders.{clip_l,clip_g,t5xxl}
    .transformer.`` (Hugging Face names; T5's tied ``encoder.embed_tokens`` left out, ``shared.weight`` kept) and the
    VAE under ``first_stage_model.`` (LDM names) -- the text encoders and VAE perturbed (a quarter of each tensor's
    spread, a fixed torch seed), so that images made with the base folder's instead differ. diffusers' own ``StableDiffusion3Pipeline
    .from_single_file`` must load the perturbed weights back (CLIP-L's projection set to the identity, as it does
    for every SD 3 file); its images for the runner's latents are ``single_file.npz`` (with its T5 in eval mode,
    which diffusers 0.39 leaves in training mode when it reads T5 from a single file)."""
    import copy

    import torch
    from diffusers import StableDiffusion3Pipeline
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(SEED + 20)
    changed = {}
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
        module = copy.deepcopy(getattr(pipeline, name))
        with torch.no_grad():
            for parameter in module.parameters():  # by a quarter of each tensor's spread (norms' ones: unchanged)
                spread = float(parameter.std()) if parameter.numel() > 1 else 0.0
                parameter.add_(0.25 * spread * torch.randn(parameter.shape, generator=generator))
        changed[name] = module
    transformer = pipeline.transformer
    tensors = stability_layout(transformer.state_dict(), transformer.config.num_layers)
    for name, prefix in (("text_encoder", "text_encoders.clip_l.transformer."),
                         ("text_encoder_2", "text_encoders.clip_g.transformer."),
                         ("text_encoder_3", "text_encoders.t5xxl.transformer.")):
        for key, tensor in changed[name].state_dict().items():
            if key != "encoder.embed_tokens.weight":
                tensors[prefix + key] = tensor.clone().contiguous()
    vae = ldm_vae_layout(changed["vae"].state_dict(), len(changed["vae"].config.block_out_channels))
    tensors.update({f"first_stage_model.{k}": v.clone().contiguous() for k, v in vae.items()})
    path = out / "tiny-sd3-all-in-one.safetensors"
    save_file(tensors, str(path))
    loaded = StableDiffusion3Pipeline.from_single_file(str(path), config=str(out / "tiny-sd3"),
                                                       local_files_only=True)
    loaded.set_progress_bar_config(disable=True)
    # diffusers 0.39's create_diffusers_t5_model_from_checkpoint never calls eval(): the T5 it returns is in training
    # mode, its dropout (0.1) on, so its images change from call to call. Inference means eval mode, as every other
    # component is returned.
    if not loaded.text_encoder_3.training:
        raise RuntimeError("diffusers' from_single_file now returns T5 in eval mode: drop the eval() below")
    loaded.text_encoder_3.eval()
    for name, module in dict(changed, transformer=transformer).items():
        expected, got = module.state_dict(), getattr(loaded, name).state_dict()
        if name == "text_encoder":
            expected = dict(expected, **{"text_projection.weight": torch.eye(CLIP_L["hidden_size"])})
        if set(expected) != set(got) or any(not torch.equal(expected[k], got[k].to(expected[k].dtype))
                                            for k in expected):
            raise RuntimeError(f"diffusers' from_single_file does not load {name} back as written")
    save_default_images(loaded, out / "single_file.npz")


# An SD 3 LoRA in diffusers' / PEFT's layout (what SD3LoraLoaderMixin reads): module -> (fan_in, fan_out), rank 4,
# no alpha (alpha = rank). Blocks 0 and 1 of tiny-sd3 have SD 3.5 Medium's dual attention (attn2).
LORA_MODULES = {"transformer.transformer_blocks.0.attn.to_q": (32, 32),
                "transformer.transformer_blocks.1.attn.add_k_proj": (32, 32),
                "transformer.transformer_blocks.0.attn2.to_v": (32, 32),
                "transformer.transformer_blocks.2.ff.net.2": (128, 32),
                "text_encoder.text_model.encoder.layers.0.self_attn.q_proj": (8, 8),
                "text_encoder_2.text_model.encoder.layers.1.self_attn.out_proj": (16, 16)}
LORA_RANK = 4


def lora_reference(out: Path) -> None:
    """``tiny-sd3-lora.safetensors`` (:data:`LORA_MODULES`, NumPy seed 5) and the images of tiny-sd3 with it loaded
    by diffusers' own ``load_lora_weights`` (peft), for the runner's latents at the default settings: ``lora.npz``."""
    from diffusers import StableDiffusion3Pipeline
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    tensors = {}
    for module, (fan_in, fan_out) in LORA_MODULES.items():
        tensors[f"{module}.lora_A.weight"] = (0.3 * rng.standard_normal((LORA_RANK, fan_in))).astype(np.float32)
        tensors[f"{module}.lora_B.weight"] = (0.3 * rng.standard_normal((fan_out, LORA_RANK))).astype(np.float32)
    path = out / "tiny-sd3-lora.safetensors"
    save_file(tensors, str(path))
    pipeline = StableDiffusion3Pipeline.from_pretrained(out / "tiny-sd3", local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    pipeline.load_lora_weights(str(out), weight_name=path.name)
    adapted = set(pipeline.get_list_adapters())
    if adapted != {"transformer", "text_encoder", "text_encoder_2"}:
        raise RuntimeError(f"diffusers loaded the LoRA into {sorted(adapted)} only")
    save_default_images(pipeline, out / "lora.npz")


def save_default_images(pipeline, path: Path) -> None:
    """``pipeline``'s images for the runner's latents at the default settings, with those latents, to ``path``."""
    import torch

    latents = runner_noise()
    with torch.no_grad():
        images = pipeline(prompt=[PROMPT] * len(latents), height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                          guidance_scale=GUIDANCE, max_sequence_length=MAX_SEQUENCE_LENGTH,
                          latents=torch.from_numpy(latents), output_type="np").images
    _save_npz(path, {"latents": latents, "images": np.asarray(images, dtype=np.float32)})


def check_saved(out: Path) -> None:
    """The saved folder, loaded back offline, gives the recorded images."""
    import torch
    from diffusers import StableDiffusion3Pipeline

    loaded = StableDiffusion3Pipeline.from_pretrained(out / "tiny-sd3", local_files_only=True)
    loaded.set_progress_bar_config(disable=True)
    with np.load(out / "pipeline.npz") as data:
        latents, expected = data["latents"], data["default_images"]
    with torch.no_grad():
        images = loaded(prompt=[PROMPT] * len(latents), height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                        guidance_scale=GUIDANCE, max_sequence_length=MAX_SEQUENCE_LENGTH,
                        latents=torch.from_numpy(latents), output_type="np").images
    if not np.array_equal(np.asarray(images, dtype=np.float32), expected):
        raise RuntimeError("the saved tiny-sd3 folder does not give the recorded images")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    transformer_references(args.out)
    import tempfile

    with tempfile.TemporaryDirectory() as staging:
        pipeline = build_pipeline(Path(staging))
    pipeline.save_pretrained(args.out / "tiny-sd3", safe_serialization=True)
    pipeline_references(pipeline, args.out)
    check_saved(args.out)
    single_file(pipeline, args.out)
    all_in_one(pipeline, args.out)
    lora_reference(args.out)
    versions = _versions()
    versions["peft"] = importlib.metadata.version("peft")
    versions["skip_layers"] = list(SKIP_LAYERS)
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    (args.out / "README.md").write_text(
        "# SD 3 / 3.5 reference fixtures\n\nMade by `tests/helpers/make_sd3_reference.py` with diffusers' PyTorch "
        "classes (versions in VERSIONS.json; the environment is make_flux_reference.py's).\n\n"
        "* `transformer-{sd3,large,medium}/`: `SD3Transformer2DModel.save_pretrained` of a tiny random transformer in "
        "each published shape (SD 3.0: no q/k norm; SD 3.5 Large: RMS q/k norm; SD 3.5 Medium: RMS q/k norm and "
        "dual attention in blocks 0 and 1), torch seeds 0, 1, 2.\n"
        "* `transformers.npz`: the inputs (`hidden_states` NCHW, `encoder_hidden_states`, `pooled_projections`, "
        "`timestep`) and, per variant, its output with every block (`<variant>_all`) and with block 1 skipped "
        "(`<variant>_skip`, diffusers' `skip_layers`), NCHW.\n"
        "* `tiny-sd3/`: `StableDiffusion3Pipeline.save_pretrained` of a tiny random pipeline (SD 3.5 Medium's "
        "transformer shape, CLIP-L and CLIP-G with projections, T5, the 16-channel VAE with SD 3's factors, "
        "FlowMatchEulerDiscreteScheduler with shift 3), torch seeds 10-14.\n"
        "* `pipeline.npz`: the runner's initial latents (`latents`: seed 0 on 2 devices, 32x32) and the pipeline's "
        "images (NHWC, [0, 1]) for the prompt at 4 steps, guidance 5, 32 T5 tokens: `default_images`, "
        "`negative_images` (negative prompt), `no_t5_images` (text_encoder_3=None), `slg_images` (skip-layer "
        "guidance on block 1, stop 0.6), `no_cfg_images` (guidance 1); `encode_prompt`'s embeddings and the "
        "scheduler's sigmas and timesteps.\n"
        "* `tiny-sd3-transformer.safetensors`: tiny-sd3's transformer in Stability AI's single-file layout "
        "(model.diffusion_model.joint_blocks.*, one CLIP tensor beside it), loaded back to the same weights by "
        "diffusers' `SD3Transformer2DModel.from_single_file`.\n"
        "* `tiny-sd3-all-in-one.safetensors`: tiny-sd3 as one file with everything inside (the MMDiT in Stability "
        "AI's layout, CLIP-L, CLIP-G and T5 under `text_encoders.*.transformer.`, the VAE under "
        "`first_stage_model.` in the LDM layout), the text encoders and VAE perturbed from the folder's; loaded "
        "back as written by diffusers' `StableDiffusion3Pipeline.from_single_file` (CLIP-L's projection the "
        "identity, as diffusers sets it), whose images for the runner's latents at the default settings are "
        "`single_file.npz` (`latents`, `images`).\n"
        "* `tiny-sd3-lora.safetensors`: an SD 3 LoRA in diffusers' / PEFT's layout (`transformer.*`, `text_encoder.*`, "
        "`text_encoder_2.*`, rank 4), and `lora.npz`: tiny-sd3's images with it loaded by diffusers' "
        "`load_lora_weights` (peft), for the runner's latents at the default settings.\n")


if __name__ == "__main__":
    main()
