"""Make the PyTorch reference fixtures for FLUX.2 [klein] (issue #63) in ``tests/fixtures/flux2/``.

The runner never imports torch. This script runs in the reference environment of make_flux_reference.py (the same
pinned versions; see its docstring), builds a tiny random-weight ``Flux2KleinPipeline`` with diffusers' own PyTorch
classes -- ``Flux2Transformer2DModel``, ``AutoencoderKLFlux2``, transformers' ``Qwen3ForCausalLM`` and a
``Qwen2TokenizerFast`` -- saves it in the published layout (``tiny-flux2-klein/``) and records what they compute, module
by module and for whole pipeline calls from the runner's noise, in ``flux2.npz``. No hub: the weights come from fixed
torch seeds; the tokenizer is a byte-level BPE trained here with ``tokenizers`` on make_flux_reference.py's corpus,
with Qwen's special tokens and the tail of Qwen3's chat template (what ``apply_chat_template(...,
add_generation_prompt=True, enable_thinking=False)`` renders for one user message). Running it twice writes identical
files.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_flux2_reference.py            # writes tests/fixtures/flux2/
    /work/refvenv/bin/python tests/helpers/make_flux2_reference.py --out DIR  # somewhere else

It also writes a LoRA in diffusers' / PEFT's layout (``tiny-flux2-lora.safetensors``) and the pipeline's images with it
loaded by diffusers' ``load_lora_weights`` (peft 0.17.1 in that environment too), and records the parameter counts of diffusers' and transformers' classes at FLUX.2 [klein] 4B's and 9B's published
shapes (built on the meta device: nothing is allocated), which the runner's ``-arch`` models are checked against.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import T5_CORPUS, _np, _save_npz, _versions

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "flux2"
SEED = 0
PROMPT = "a red cube on a table"
NEGATIVE_PROMPT = "blurry"
HEIGHT, WIDTH = 32, 64  # not square: rows and columns of the tokens are told apart
EDIT_HEIGHT, EDIT_WIDTH = 64, 128  # the editing runs' size and their reference image's (diffusers takes 64 at least)
NUM_DEVICES = 2
MAX_SEQUENCE_LENGTH = 40  # Flux2KleinPipeline pads (and cuts) every prompt to this many tokens
STEPS = 3
GUIDANCE = 4.0  # the base (undistilled) model's classifier-free guidance
OUT_LAYERS = (9, 18, 27)  # Flux2KleinPipeline's text_encoder_out_layers

# FLUX.2 [klein]'s transformer at toy size: two heads of 16 (= 4 x 4, the four rotary axes), one double-stream
# block, two single-stream ones; 2x2-patchified 8-channel latents in (32), three Qwen3 layers' width (3 x 32).
TRANSFORMER = dict(patch_size=1, in_channels=32, num_layers=1, num_single_layers=2, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=96, timestep_guidance_channels=256, mlp_ratio=3.0,
                   axes_dims_rope=(4, 4, 4, 4), rope_theta=2000, eps=1e-6, guidance_embeds=False)
# FLUX.2's VAE (AutoencoderKLFlux2): quant convs, a batch norm's running statistics over the 2x2-patchified latents;
# four levels (8x down-sampling, as the real one) at toy width, 8 latent channels (the real one: 32).
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(4, 8, 8, 8), layers_per_block=1,
           act_fn="silu", latent_channels=8, norm_num_groups=2, sample_size=32, force_upcast=True,
           use_quant_conv=True, use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4,
           batch_norm_momentum=0.1, patch_size=(2, 2))
# Qwen3 (Qwen3-4B's kind: grouped-query attention with per-head q/k RMS norms, tied embeddings) at toy width, deep
# enough that hidden states 9, 18 and 27 are layers' outputs as in the real 36-layer model.
QWEN3 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=28, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu",
             tie_word_embeddings=True, attention_bias=False, use_sliding_window=False)
# FLUX.2 [klein]'s scheduler config (black-forest-labs/FLUX.2-klein-4B scheduler/scheduler_config.json's values; the
# pipeline passes its own mu, compute_empirical_mu)
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen's, ids after the vocabulary's
ADDED = ("<think>", "</think>")  # Qwen3's added (not special) tokens
# The tail of Qwen3's chat template that one user message with enable_thinking=False renders
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                 "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                 "{%- if enable_thinking is defined and enable_thinking is false %}"
                 "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
VOCAB = 300
ATTENTION_GAIN = 3.0  # the transformer's value and output projections, scaled (_build)
COMPONENT_SEEDS = dict(transformer=SEED, vae=SEED + 1, text_encoder=SEED + 2)

# Published shapes (black-forest-labs/FLUX.2-klein-4B and -9B: transformer/config.json, text_encoder/config.json
# (Qwen3-4B, Qwen3-8B), vae/config.json), for the parameter counts of the -arch models.
ARCH = {
    "4b": dict(transformer=dict(num_layers=5, num_single_layers=20, num_attention_heads=24, joint_attention_dim=7680),
               qwen3=dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)),
    "9b": dict(transformer=dict(num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288),
               qwen3=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)),
}


def _tokenizer(staging: Path):
    """A Qwen2TokenizerFast over a byte-level BPE trained here (Qwen's layout: the vocabulary, then <|endoftext|>,
    <|im_start|>, <|im_end|> as special tokens and <think>, </think> as added ones; no BOS or EOS added; padded
    with <|endoftext|> on the right)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2TokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(T5_CORPUS.splitlines(), trainer=trainer)
    staging.mkdir(parents=True, exist_ok=True)
    backend.save(str(staging / "tokenizer.json"))
    tokenizer = Qwen2TokenizerFast(tokenizer_file=str(staging / "tokenizer.json"), unk_token=None, bos_token=None,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=131072)
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True) for t in SPECIAL[1:]]})
    tokenizer.add_special_tokens({"pad_token": "<|endoftext|>"})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _build(staging: Path, distilled: bool = True):
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = _tokenizer(staging / "tokenizer")
    torch.manual_seed(COMPONENT_SEEDS["transformer"])
    transformer = Flux2Transformer2DModel(**TRANSFORMER)
    with torch.no_grad():  # its attention's values scaled up: the reference images move the images by more than the
        for name, parameter in transformer.named_parameters():  # checks' bound (at random initialisation they barely do)
            if any(part in name for part in ("attn.to_v.", "attn.to_out.", "attn.to_qkv_mlp_proj.")):
                parameter.mul_(ATTENTION_GAIN)
    torch.manual_seed(COMPONENT_SEEDS["vae"])
    vae = AutoencoderKLFlux2(**VAE)
    with torch.no_grad():  # the batch norm's statistics as a trained VAE has them (not 0 and 1)
        vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.running_mean.shape))
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape))
    torch.manual_seed(COMPONENT_SEEDS["text_encoder"])
    config = Qwen3Config(vocab_size=-(-len(tokenizer) // 16) * 16, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **QWEN3)
    text_encoder = Qwen3ForCausalLM(config)
    text_encoder.config.torch_dtype = "float32"
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    pipeline = Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                  transformer=transformer, is_distilled=distilled)
    for module in (transformer, vae, text_encoder):
        module.eval()
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def runner_noise(height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """The runner's initial latents for seed SEED on NUM_DEVICES devices, one image each: device i draws
    ``jax.random.normal(split(PRNGKey(seed), num_devices)[i], (1, 4 c, H/16, W/16), float32)`` -- the patchified
    latents Flux2KleinPipeline.prepare_latents draws (families/flux2/engine/stages.py: txt2img)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(SEED), NUM_DEVICES)
    shape = (1, 4 * VAE["latent_channels"], height // 16, width // 16)
    return np.concatenate([np.asarray(jax.random.normal(key, shape, dtype=jnp.float32)) for key in keys])


def _module_references(pipeline) -> dict[str, np.ndarray]:
    """Each module on fixed inputs: the Qwen3 hidden states the pipeline stacks, the transformer's prediction, the
    VAE's decode and encode (its posterior's mean), and the pipeline's own helpers."""
    import torch

    out: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(SEED)
    with torch.no_grad():
        text = pipeline.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                      add_generation_prompt=True, enable_thinking=False)
        inputs = pipeline.tokenizer(text, return_tensors="pt", padding="max_length", truncation=True,
                                    max_length=MAX_SEQUENCE_LENGTH)
        hidden = pipeline.text_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                       output_hidden_states=True, use_cache=False).hidden_states
        out["qwen3.text"] = np.asarray(text)
        out["qwen3.input_ids"] = _np(inputs["input_ids"])
        out["qwen3.attention_mask"] = _np(inputs["attention_mask"])
        out["qwen3.hidden_states"] = np.stack([_np(h) for h in hidden])  # (layers + 1, 1, seq, width)
        out["prompt_embeds"] = _np(pipeline.encode_prompt(PROMPT, max_sequence_length=MAX_SEQUENCE_LENGTH)[0])

        tokens, text_tokens = 8, 5
        x = rng.standard_normal((2, tokens, TRANSFORMER["in_channels"])).astype(np.float32)
        context = rng.standard_normal((2, text_tokens, TRANSFORMER["joint_attention_dim"])).astype(np.float32)
        latents = torch.zeros((1, TRANSFORMER["in_channels"], 2, 4))
        img_ids = pipeline._prepare_latent_ids(latents)
        txt_ids = pipeline._prepare_text_ids(torch.from_numpy(context))
        timestep = np.asarray([0.7, 0.25], np.float32)
        prediction = pipeline.transformer(hidden_states=torch.from_numpy(x), encoder_hidden_states=torch.from_numpy(
            context), timestep=torch.from_numpy(timestep), img_ids=img_ids, txt_ids=txt_ids, guidance=None,
            return_dict=False)[0]
        out.update({"transformer.hidden_states": x, "transformer.encoder_hidden_states": context,
                    "transformer.timestep": timestep, "transformer.img_ids": _np(img_ids),
                    "transformer.txt_ids": _np(txt_ids), "transformer.out": _np(prediction)})

        vae_latents = rng.standard_normal((1, VAE["latent_channels"], 4, 8)).astype(np.float32)
        out["vae.latents"] = vae_latents
        out["vae.decoded"] = _np(pipeline.vae.decode(torch.from_numpy(vae_latents)).sample)
        image = rng.uniform(-1, 1, (1, 3, 32, 64)).astype(np.float32)
        out["vae.image"] = image
        out["vae.encoded_mean"] = _np(pipeline.vae.encode(torch.from_numpy(image)).latent_dist.mean)
        out["vae.bn_mean"] = _np(pipeline.vae.bn.running_mean)
        out["vae.bn_var"] = _np(pipeline.vae.bn.running_var)
    return out


def _call(pipeline, latents: np.ndarray, **kwargs) -> np.ndarray:
    import torch

    batch, _, height, width = latents.shape
    with torch.no_grad():  # (the pipeline packs the (batch, 4 c, h, w) latents it is given itself)
        images = pipeline(prompt=[PROMPT] * batch, height=16 * height, width=16 * width, num_inference_steps=STEPS,
                          max_sequence_length=MAX_SEQUENCE_LENGTH, latents=torch.from_numpy(latents), output_type="np", **kwargs).images
    return np.asarray(images, dtype=np.float32)


def _pipeline_references(pipeline) -> dict[str, np.ndarray]:
    """The distilled pipeline (no guidance) and the base one (classifier-free guidance with the empty negative
    prompt) from the runner's noise, with the schedule the pipeline sets."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    latents = runner_noise()
    out = {"latents": latents, "images": _call(pipeline, latents, guidance_scale=1.0)}
    seq_len = (HEIGHT // 16) * (WIDTH // 16)
    out["mu"] = np.asarray(compute_empirical_mu(seq_len, STEPS), np.float64)
    out["sigmas"] = _np(pipeline.scheduler.sigmas)
    pipeline.register_to_config(is_distilled=False)
    try:
        out["base_images"] = _call(pipeline, latents, guidance_scale=GUIDANCE)
    finally:
        pipeline.register_to_config(is_distilled=True)
    if np.abs(out["base_images"] - out["images"]).max() < 1e-3:
        raise RuntimeError("guidance changed nothing: the reference would not tell CFG from none")
    return out


# A FLUX.2 LoRA in diffusers' / PEFT's layout (what Flux2LoraLoaderMixin reads: the transformer's module paths): module
# -> (fan_in, fan_out), rank 4, no alpha -- attention, feed-forward, the fused single-block projections and a shared
# modulation.
LORA_MODULES = {"transformer.transformer_blocks.0.attn.to_q": (32, 32),
                "transformer.transformer_blocks.0.attn.add_k_proj": (32, 32),
                "transformer.transformer_blocks.0.ff.linear_in": (32, 192),
                "transformer.single_transformer_blocks.1.attn.to_qkv_mlp_proj": (32, 288),
                "transformer.single_transformer_blocks.0.attn.to_out": (128, 32),
                "transformer.double_stream_modulation_img.linear": (32, 192)}
LORA_RANK = 4


def _lora_reference(folder: Path, out: Path) -> dict[str, np.ndarray]:
    """``tiny-flux2-lora.safetensors`` (:data:`LORA_MODULES`, NumPy seed 5) and the distilled pipeline's images with it
    loaded by diffusers' own ``load_lora_weights`` (peft), for the runner's latents."""
    from diffusers import Flux2KleinPipeline
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    tensors = {}
    for module, (fan_in, fan_out) in LORA_MODULES.items():
        tensors[f"{module}.lora_A.weight"] = (0.3 * rng.standard_normal((LORA_RANK, fan_in))).astype(np.float32)
        tensors[f"{module}.lora_B.weight"] = (0.3 * rng.standard_normal((fan_out, LORA_RANK))).astype(np.float32)
    path = out / "tiny-flux2-lora.safetensors"
    save_file(tensors, str(path))
    pipeline = Flux2KleinPipeline.from_pretrained(folder, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    pipeline.load_lora_weights(str(out), weight_name=path.name)
    if set(pipeline.get_list_adapters()) != {"transformer"}:
        raise RuntimeError(f"diffusers loaded the LoRA into {pipeline.get_list_adapters()}")
    images = {"lora_images": _call(pipeline, runner_noise(), guidance_scale=1.0)}
    return {**images, **_bfl_lora_reference(folder, out)}


# An ai-toolkit FLUX.2 LoRA (BFL's module names after diffusion_model.): module -> (fan_in, fan_out), rank 4, with the
# fused q/k/v of a double block and a single block's fused projections
BFL_LORA_MODULES = {"double_blocks.0.img_attn.qkv": (32, 96), "double_blocks.0.txt_mlp.0": (32, 192),
                    "single_blocks.0.linear1": (32, 288), "single_blocks.1.linear2": (128, 32),
                    "double_stream_modulation_txt.lin": (32, 192)}


def _bfl_lora_reference(folder: Path, out: Path) -> dict[str, np.ndarray]:
    """``tiny-flux2-bfl-lora.safetensors`` (:data:`BFL_LORA_MODULES`, NumPy seed 6) and the distilled pipeline's images
    with it loaded by diffusers' ``load_lora_weights`` (which converts ai-toolkit's layout itself)."""
    from diffusers import Flux2KleinPipeline
    from safetensors.numpy import save_file

    rng = np.random.default_rng(6)
    tensors = {}
    for module, (fan_in, fan_out) in BFL_LORA_MODULES.items():
        tensors[f"diffusion_model.{module}.lora_A.weight"] = (0.3 * rng.standard_normal((LORA_RANK, fan_in))).astype(
            np.float32)
        tensors[f"diffusion_model.{module}.lora_B.weight"] = (0.3 * rng.standard_normal((fan_out, LORA_RANK))).astype(
            np.float32)
    path = out / "tiny-flux2-bfl-lora.safetensors"
    save_file(tensors, str(path))
    pipeline = Flux2KleinPipeline.from_pretrained(folder, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    pipeline.load_lora_weights(str(out), weight_name=path.name)
    return {"bfl_lora_images": _call(pipeline, runner_noise(), guidance_scale=1.0)}


def edit_image() -> np.ndarray:
    """The reference image the editing runs read: EDIT_WIDTH x EDIT_HEIGHT RGB, uint8 from NumPy seed 7, as the test
    writes it to a PNG."""
    rng = np.random.default_rng(7)
    rows = np.linspace(0, 1, EDIT_HEIGHT)[:, None, None]
    columns = np.linspace(0, 1, EDIT_WIDTH)[None, :, None]
    colour = rng.uniform(size=(1, 1, 3))
    noise = 0.1 * rng.uniform(size=(EDIT_HEIGHT, EDIT_WIDTH, 3))
    return np.round(255 * np.clip(0.5 * rows + 0.5 * columns * colour + noise, 0, 1)).astype(np.uint8)


def _edit_references(pipeline) -> dict[str, np.ndarray]:
    """Flux2KleinPipeline given one reference image (its ``image``: VAE-encoded at its own size, the posterior's mode,
    patchified, normalised by the batch norm's statistics, its tokens after the noise's with time coordinate 10),
    distilled and as a base model at guidance 4, from the runner's noise."""
    from PIL import Image

    image, latents = edit_image(), runner_noise(EDIT_HEIGHT, EDIT_WIDTH)
    out = {"edit_image": image, "edit_images": _call(pipeline, latents, guidance_scale=1.0,
                                                     image=Image.fromarray(image))}
    if np.abs(out["edit_images"] - _call(pipeline, latents, guidance_scale=1.0)).max() < 1e-3:
        raise RuntimeError("the reference image changed nothing: the reference would not tell editing from txt2img")
    pipeline.register_to_config(is_distilled=False)
    try:
        out["base_edit_images"] = _call(pipeline, latents, guidance_scale=GUIDANCE, image=Image.fromarray(image))
    finally:
        pipeline.register_to_config(is_distilled=True)
    second = second_image()  # two reference images: the second's tokens at time coordinate 20
    out["second_image"] = second
    out["two_reference_images"] = _call(pipeline, latents, guidance_scale=1.0,
                                        image=[Image.fromarray(image), Image.fromarray(second)])
    if np.abs(out["two_reference_images"] - out["edit_images"]).max() < 1e-3:
        raise RuntimeError("the second reference image changed nothing")
    return out


def second_image() -> np.ndarray:
    """A second reference image, EDIT_WIDTH x EDIT_HEIGHT: the first's colours reversed, from NumPy seed 8's noise."""
    rng = np.random.default_rng(8)
    return np.clip(255 - edit_image().astype(int) + rng.integers(-20, 20, size=(EDIT_HEIGHT, EDIT_WIDTH, 3)),
                   0, 255).astype(np.uint8)


INPAINT_STRENGTH = 0.6  # of 3 steps: the last 2 run (get_timesteps: int(3 - 3 * 0.6) = 1 is the start)


def inpaint_mask() -> np.ndarray:
    """The mask the inpainting runs read: EDIT_HEIGHT x EDIT_WIDTH, 255 (repaint) in a rectangle whose edges fall
    half-way between the pixels the pipeline's bilinear resize to the token grid reads (so some tokens are 0.5)."""
    mask = np.zeros((EDIT_HEIGHT, EDIT_WIDTH), np.uint8)
    mask[24:56, 40:104] = 255
    return mask


def _inpaint_references(pipeline) -> dict[str, np.ndarray]:
    """Flux2KleinInpaintPipeline on the same components (distilled, and base at guidance 4): the reference image
    repainted in the mask's area at strength 0.6 -- its latents (the posterior's mode) noised to the start with the
    runner's noise (the pipeline module's randn_tensor given those draws), read again as a reference image's tokens, and
    blended back outside the mask (resized bilinearly to the token grid) after each step."""
    import torch
    from diffusers import Flux2KleinInpaintPipeline
    from diffusers.pipelines.flux2 import pipeline_flux2_klein_inpaint as module
    from PIL import Image

    noise = runner_noise(EDIT_HEIGHT, EDIT_WIDTH)

    def given_noise(shape, generator=None, device=None, dtype=None, layout=None):
        if tuple(shape) != noise.shape:
            raise RuntimeError(f"the pipeline drew {tuple(shape)}, the runner's noise is {noise.shape}")
        return torch.from_numpy(noise).to(dtype)

    inpaint = Flux2KleinInpaintPipeline(**pipeline.components, is_distilled=True)
    inpaint.set_progress_bar_config(disable=True)
    out = {"inpaint_mask": inpaint_mask(), "inpaint_strength": np.asarray(INPAINT_STRENGTH)}
    saved = module.randn_tensor
    module.randn_tensor = given_noise
    try:
        for key, distilled, guidance in (("inpaint_images", True, 1.0), ("base_inpaint_images", False, GUIDANCE)):
            inpaint.register_to_config(is_distilled=distilled)
            with torch.no_grad():
                images = inpaint(prompt=[PROMPT] * NUM_DEVICES, image=Image.fromarray(edit_image()),
                                 mask_image=Image.fromarray(inpaint_mask()), strength=INPAINT_STRENGTH,
                                 num_inference_steps=STEPS, guidance_scale=guidance,
                                 max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="np").images
            out[key] = np.asarray(images, dtype=np.float32)
        inpaint.register_to_config(is_distilled=True)
        with torch.no_grad():  # and a reference image beside (image_reference: time coordinate 20)
            images = inpaint(prompt=[PROMPT] * NUM_DEVICES, image=Image.fromarray(edit_image()),
                             image_reference=Image.fromarray(second_image()), mask_image=Image.fromarray(inpaint_mask()),
                             strength=INPAINT_STRENGTH, num_inference_steps=STEPS, guidance_scale=1.0,
                             max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="np").images
        out["inpaint_reference_images"] = np.asarray(images, dtype=np.float32)
    finally:
        module.randn_tensor = saved
    return out


def _bfl_single_file(folder: Path, out: Path) -> None:
    """``tiny-flux2-klein-transformer.safetensors``: the tiny transformer as one file in Black Forest Labs' layout (the
    hub's flux-2-klein-4b.safetensors' names), written by inverting diffusers' convert_flux2_transformer_checkpoint_
    to_diffusers, and checked by loading it back with diffusers' own ``from_single_file``: the same weights."""
    import torch
    from diffusers import Flux2Transformer2DModel
    from safetensors.torch import save_file

    transformer = Flux2Transformer2DModel.from_pretrained(folder / "transformer", local_files_only=True)
    state = {name: value.detach().clone() for name, value in transformer.state_dict().items()}
    double = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
              "attn.to_out.0.weight": "img_attn.proj.weight", "ff.linear_in.weight": "img_mlp.0.weight",
              "ff.linear_out.weight": "img_mlp.2.weight", "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
              "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale", "attn.to_add_out.weight": "txt_attn.proj.weight",
              "ff_context.linear_in.weight": "txt_mlp.0.weight", "ff_context.linear_out.weight": "txt_mlp.2.weight"}
    single = {"attn.to_qkv_mlp_proj.weight": "linear1.weight", "attn.to_out.weight": "linear2.weight",
              "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale"}
    top = {"x_embedder.weight": "img_in.weight", "context_embedder.weight": "txt_in.weight",
           "time_guidance_embed.timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
           "time_guidance_embed.timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
           "double_stream_modulation_img.linear.weight": "double_stream_modulation_img.lin.weight",
           "double_stream_modulation_txt.linear.weight": "double_stream_modulation_txt.lin.weight",
           "single_stream_modulation.linear.weight": "single_stream_modulation.lin.weight",
           "proj_out.weight": "final_layer.linear.weight"}
    bfl = {}
    for i in range(TRANSFORMER["num_layers"]):
        prefix = f"transformer_blocks.{i}."
        for ours, theirs in double.items():
            bfl[f"double_blocks.{i}.{theirs}"] = state.pop(prefix + ours)
        for stream, names in (("img", ("to_q", "to_k", "to_v")), ("txt", ("add_q_proj", "add_k_proj", "add_v_proj"))):
            bfl[f"double_blocks.{i}.{stream}_attn.qkv.weight"] = torch.cat(
                [state.pop(f"{prefix}attn.{name}.weight") for name in names])
    for i in range(TRANSFORMER["num_single_layers"]):
        for ours, theirs in single.items():
            bfl[f"single_blocks.{i}.{theirs}"] = state.pop(f"single_transformer_blocks.{i}.{ours}")
    for ours, theirs in top.items():
        bfl[theirs] = state.pop(ours)
    scale, shift = state.pop("norm_out.linear.weight").chunk(2)
    bfl["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale])
    if state:
        raise RuntimeError(f"not written in BFL's layout: {sorted(state)}")
    path = out / "tiny-flux2-klein-transformer.safetensors"
    save_file({name: value.contiguous() for name, value in sorted(bfl.items())}, str(path))
    loaded = Flux2Transformer2DModel.from_single_file(str(path), config=str(folder / "transformer"))
    for name, value in transformer.state_dict().items():
        if not torch.equal(loaded.state_dict()[name], value):
            raise RuntimeError(f"from_single_file does not read {name} back")


def _parameter_counts() -> dict[str, np.ndarray]:
    """diffusers' and transformers' parameter counts at klein's published shapes (meta device; the VAE's buffers --
    the batch norm's statistics -- counted as the runner counts them, with its parameters)."""
    import torch
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    out = {}
    with torch.device("meta"):
        for size, spec in ARCH.items():
            transformer = Flux2Transformer2DModel(**dict(TRANSFORMER, in_channels=128, attention_head_dim=128,
                                                         axes_dims_rope=(32, 32, 32, 32), **spec["transformer"]))
            out[f"params.{size}.transformer"] = np.asarray(sum(p.numel() for p in transformer.parameters()), np.int64)
            qwen3 = Qwen3Model(Qwen3Config(**dict(QWEN3, **spec["qwen3"])))
            out[f"params.{size}.text_encoder"] = np.asarray(sum(p.numel() for p in qwen3.parameters()), np.int64)
        vae = AutoencoderKLFlux2()
        out["params.vae"] = np.asarray(sum(p.numel() for p in vae.parameters()) + sum(
            b.numel() for name, b in vae.named_buffers() if name.startswith("bn.running")), np.int64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as staging:
        pipeline = _build(Path(staging))
        folder = args.out / "tiny-flux2-klein"
        if folder.exists():
            shutil.rmtree(folder)
        pipeline.save_pretrained(folder, safe_serialization=True)
        arrays = {**_module_references(pipeline), **_pipeline_references(pipeline), **_edit_references(pipeline),
                  **_inpaint_references(pipeline), **_parameter_counts(),
                  "prompt": np.asarray(PROMPT), "height": np.asarray(HEIGHT), "width": np.asarray(WIDTH),
                  "steps": np.asarray(STEPS), "guidance": np.asarray(GUIDANCE), "seed": np.asarray(SEED),
                  "num_devices": np.asarray(NUM_DEVICES), "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH)}
    from diffusers import Flux2KleinPipeline

    reloaded = Flux2KleinPipeline.from_pretrained(folder)
    reloaded.set_progress_bar_config(disable=True)
    if not np.array_equal(_call(reloaded, arrays["latents"], guidance_scale=1.0), arrays["images"]):
        raise RuntimeError("the saved folder does not reproduce the recorded images")
    arrays.update(_lora_reference(folder, args.out))
    _bfl_single_file(folder, args.out)
    _save_npz(args.out / "flux2.npz", arrays)
    versions = dict(_versions(), script="tests/helpers/make_flux2_reference.py")
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}/flux2.npz and {folder}/")


if __name__ == "__main__":
    main()
