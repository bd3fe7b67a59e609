"""Make the PyTorch references for image to image and inpainting on the flow families (issue #63) in
``tests/fixtures/flow_image_modes/``.

The runner never imports torch. This script runs in the reference environment of make_flux_reference.py (its
docstring says how to make it): it loads the published tiny FLUX.1 [dev] folder (``tests/fixtures/flux/
tiny-flux-dev``) into diffusers' PyTorch ``FluxImg2ImgPipeline`` and ``FluxInpaintPipeline`` and the tiny SD 3
folder (``tests/fixtures/sd3/tiny-sd3``, make_sd3_reference.py) into ``StableDiffusion3Img2ImgPipeline`` and
``StableDiffusion3InpaintPipeline``, and calls each on a fixed 32x32 init image (``init.png``, written here; the
inpaint pipelines with ``mask.png`` too, white where they repaint) at each strength, one image per call for each of the runner's 2 devices, from
the runner's own random draws (seed 0): the noise ``jax.random.normal(key_i, (1, 16, 4, 4))`` and the VAE
posterior's sample ``mean + std * jax.random.normal(key_i, (1, 4, 4, 16))`` (NHWC, transposed), both from device
i's key ``split(PRNGKey(0), 2)[i]`` (families/flux/engine/stages.py: txt2img, with_init_image). diffusers draws both
with a torch generator: here the pipeline module's ``randn_tensor`` and ``retrieve_latents`` are given those draws
instead, so everything else -- preprocessing, ``(latents - shift) * scaling``, ``get_timesteps``, ``scale_noise``,
the Euler loop, guidance, the decode -- is the pipeline's own.

One departure: diffusers 0.39's ``StableDiffusion3InpaintPipeline`` decodes its final latents as ``latents /
scaling_factor`` without adding the VAE's ``shift_factor`` back, where its txt2img and img2img pipelines (and every
FLUX.1 pipeline) decode ``latents / scaling_factor + shift_factor``, the inverse of its own encode (reported
upstream: huggingface/diffusers#13611, "Issue 1"; fix proposed in #14671): its latents are taken
(``output_type="latent"``) and decoded as those pipelines decode them.

FLUX.1 Fill (``FluxFillPipeline``: the mask and the masked image's latents as more transformer input channels, no
blend) runs on tiny-flux-dev with a transformer of Fill's shape made here (``tiny-flux-fill-transformer/``; the
folder is assembled by :func:`fill_folder`, as the test assembles it); its posterior sample of the masked image is
the same draw as the init image's (one key per device, as the runner draws both).

FLUX.1 Canny/Depth [dev] (``FluxControlPipeline``: a control image's latents as more transformer input channels,
from noise) runs on tiny-flux-dev with a transformer of their shape made here (``tiny-flux-control-transformer/``,
assembled by :func:`control_folder`) on a fixed edge map (``control.png``); its posterior sample of the control image
is the runner's draw (the init image's draw above: the VAE's ``DiagonalGaussianDistribution.sample``, which the
pipeline calls directly, is given it) and the noise the runner's. It writes ``flux_control.npz`` (``images``, one
per device, and ``control_images``: the same draws with the control image inverted, which the test tells apart), and
the same model from ``init.png`` (``FluxControlImg2ImgPipeline``, ``img2img_S`` at strengths S) and repainting
``mask.png``'s area (``FluxControlInpaintPipeline``, ``inpaint_S``). ``--only control`` writes it (and its transformer)
alone.

A FLUX.1 ControlNet (``FluxControlNetPipeline`` with diffusers' ``FluxControlNetModel``: a copy of the transformer's
first blocks reading the control image's latents too, whose block outputs the transformer adds after its own) runs on
tiny-flux-dev with a tiny random ControlNet made here (``tiny-flux-controlnet/``, the published layout) on the same
edge map, at two conditioning scales and at 0 (``flux_controlnet.npz``: ``images_S``, ``plain``); and a union model of
its shape with UNION_MODES control modes (``tiny-flux-controlnet-union/``) at two of them (``union_M``); the first
steering only the middle two of the four steps (``control_guidance_start``/``end`` 0.25 and 0.75: ``window_1``);
and XLabs' kind (``tiny-flux-controlnet-xlabs/``: the control image in pixels through an input hint block, its
double-block residuals repeated) at scale 1 (``xlabs_1``); ``--only controlnet`` writes them alone.

SD 3 ControlNets (``StableDiffusion3ControlNetPipeline`` with diffusers' ``SD3ControlNetModel``) run on tiny-sd3 with
two tiny random ControlNets made here on the same edge map: InstantX's kind (``tiny-sd3-controlnet/``: joint blocks
reading the prompt, a position embedding of its own, zero pooled text, no VAE shift on the control image) at two
conditioning scales and at 0, and SD 3.5 Large's kind (``tiny-sd3-controlnet-single/``: single blocks, no text, the
transformer's position embedding, the pooled text, the VAE's shift) at one; the first also steering only the middle
two of the four steps (``control_guidance_start``/``end`` 0.25 and 0.75: ``window_1``, as for FLUX.1's); plus each ControlNet's own residuals for
fixed random inputs (``sd3_controlnet.npz``: ``images_S``, ``plain``, ``single_S``, ``call_*``); and an inpainting
ControlNet (``tiny-sd3-controlnet-inpaint/``, ``StableDiffusion3ControlNetInpaintingPipeline``: the init image with
the mask's area masked out, and the mask) repainting ``mask.png``'s area of ``init.png`` (``inpaint_1``). The pipeline encodes
the control image doubled for guidance's two halves, one posterior sample each from torch's global generator; the
runner draws one per image, read by both halves: the sample is given that draw for both. ``--only sd3_controlnet``
writes them alone.

``FAMILY_MODE.npz`` (``flux_img2img.npz``, ``sd3_inpaint.npz``, ``flux_fill.npz``, ...) holds ``images_S`` (device, H, W, 3) in [0, 1]
per strength S, and the settings;
``VERSIONS.json`` the libraries it ran with. Running it again writes identical files.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_flow_image_modes_reference.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# (importing it sets the offline and CPU-only environment, before torch, diffusers or jax load)
from make_flux_reference import (
    HEIGHT,
    MAX_SEQUENCE_LENGTH,
    NUM_DEVICES,
    PROMPT,
    SEED,
    VARIANTS,
    WIDTH,
    _save_npz,
    _versions,
    load_aligned,
    quiet_deterministic_torch,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "flow_image_modes"
# (family, mode) -> (folder, diffusers' pipeline class, its module under diffusers.pipelines, guidance scale)
FLUX_FOLDER, SD3_FOLDER = ROOT / "tests" / "fixtures" / "flux" / "tiny-flux-dev", ROOT / "tests" / "fixtures" / "sd3" / "tiny-sd3"
SD3_GUIDANCE = 5.0  # make_sd3_reference's GUIDANCE
PIPELINES = {
    ("flux", "img2img"): (FLUX_FOLDER, "FluxImg2ImgPipeline", "flux.pipeline_flux_img2img",
                          VARIANTS["dev"]["guidance_scale"]),
    ("flux", "inpaint"): (FLUX_FOLDER, "FluxInpaintPipeline", "flux.pipeline_flux_inpaint",
                          VARIANTS["dev"]["guidance_scale"]),
    ("sd3", "img2img"): (SD3_FOLDER, "StableDiffusion3Img2ImgPipeline",
                         "stable_diffusion_3.pipeline_stable_diffusion_3_img2img", SD3_GUIDANCE),
    ("sd3", "inpaint"): (SD3_FOLDER, "StableDiffusion3InpaintPipeline",
                         "stable_diffusion_3.pipeline_stable_diffusion_3_inpaint", SD3_GUIDANCE),
}
# FLUX.1 Fill (issue #63 item 1): the tiny FLUX.1 [dev] folder with a transformer of Fill's shape -- its input the
# packed latents (64), the masked image's packed latents (64) and the mask's 8 x 8 pixels per latent pixel, packed
# (256): 384 channels in, 64 out -- made here (torch seed FILL_SEED, saved to FILL_TRANSFORMER) and the index naming
# FluxFillPipeline: fill_folder() assembles it, as the test does.
PIPELINES[("flux", "fill")] = (None, "FluxFillPipeline", "flux.pipeline_flux_fill", VARIANTS["dev"]["guidance_scale"])
FILL_TRANSFORMER = DEFAULT_OUT / "tiny-flux-fill-transformer"
FILL_SEED = 20
# FLUX.1 Canny/Depth [dev] (issue #63 item 2): the tiny FLUX.1 [dev] folder with a transformer of their shape --
# the packed latents (64) and the control image's packed latents (64): 128 channels in, 64 out -- made here (torch
# seed CONTROL_SEED) and the index naming FluxControlPipeline: control_folder() assembles it, as the test does.
CONTROL_TRANSFORMER = DEFAULT_OUT / "tiny-flux-control-transformer"
CONTROL_SEED = 21
# ... from init.png (FluxControlImg2ImgPipeline) at these strengths, and repainting mask.png's area
# (FluxControlInpaintPipeline) at CONTROL_INPAINT
CONTROL_STRENGTHS, CONTROL_INPAINT = (0.6, 1.0), 0.8
# FLUX.1 ControlNets (issue #63 item 1): a tiny random FluxControlNetModel beside tiny-flux-dev's transformer -- one
# double block and one single block, against the transformer's one and two (so both single blocks read the one
# residual: diffusers' interval_control), its zero-initialised projections drawn at random too (else it adds nothing)
# -- made here (torch seed CONTROLNET_SEED) in the published layout (config.json, diffusion_pytorch_model.safetensors)
CONTROLNET = DEFAULT_OUT / "tiny-flux-controlnet"
CONTROLNET_SEED = 22
CONTROLNET_SCALES = (0.7, 1.0)
# the part of the steps a ControlNet steers (control_guidance_start, control_guidance_end): of 4 steps the middle two
# (diffusers' controlnet_keep: 1 - (i / 4 < 0.25 or (i + 1) / 4 > 0.75)), at scale 1 (``window_1``)
CONTROL_WINDOW = (0.25, 0.75)
# a union ControlNet (InstantX's, Shakker-Labs' kind: num_mode, a control-mode token before the text), made likewise
UNION = DEFAULT_OUT / "tiny-flux-controlnet-union"
UNION_SEED, UNION_MODES, UNION_RUN = 23, 4, (1, 3)
# XLabs' kind (conditioning_embedding_channels: the control image in pixels through an input hint block, 16 channels
# in patches of 2 -- the packed latents' 64 --; two double blocks, no single ones, their residuals repeated over the
# transformer's double blocks), made likewise, its zero-initialised hint output drawn at random too
XLABS = DEFAULT_OUT / "tiny-flux-controlnet-xlabs"
XLABS_SEED = 25
XLABS_SHAPE = dict(num_layers=2, num_single_layers=0, conditioning_embedding_channels=16, patch_size=2)
# SD 3 ControlNets (issue #63 item 1): tiny random SD3ControlNetModels of tiny-sd3's transformer's widths, two blocks
# against its three (interval_control 1.5: its first two blocks read residuals 0 and 0, the last none), the
# zero-initialised projections drawn at random too -- InstantX's kind and SD 3.5 Large's (module docstring) -- made
# here (torch seed SD3_CONTROLNET_SEED) in the published layout
SD3_CONTROLNET = DEFAULT_OUT / "tiny-sd3-controlnet"
SD3_CONTROLNET_SINGLE = DEFAULT_OUT / "tiny-sd3-controlnet-single"
SD3_CONTROLNET_SEED = 24
# ... and an inpainting one (alimama-creative's kind, extra_conditioning_channels 1: StableDiffusion3ControlNetInpainting
# Pipeline, repainting mask.png's area of init.png: ``inpaint_1``)
SD3_CONTROLNET_INPAINT = DEFAULT_OUT / "tiny-sd3-controlnet-inpaint"
SD3_SINGLE = dict(joint_attention_dim=None, use_pos_embed=False, pos_embed_max_size=None, pos_embed_type=None,
                  dual_attention_layers=(), qk_norm=None, force_zeros_for_pooled_projection=False)
STEPS = 4
# 4 steps at 0.6: get_timesteps' start int(4 - 2.4) = 1, three steps run (the Flax rule would run two); at 0.3 two
# run; at 1.0 all four, from the noise alone (sigma 1)
STRENGTHS = (0.3, 0.6, 1.0)


def init_image() -> np.ndarray:
    """A fixed 32x32 RGB picture: smooth gradients and a square, uint8."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    picture = np.stack([x / (WIDTH - 1), y / (HEIGHT - 1), 0.5 + 0.5 * np.sin((x + y) / 5.0)], axis=-1)
    picture[8:20, 10:24] = (0.9, 0.2, 0.1)
    return np.round(picture * 255).astype(np.uint8)


def mask_image() -> np.ndarray:
    """A fixed 32x32 mask, white (repaint) in a rectangle off the centre, black elsewhere: uint8 grayscale."""
    mask = np.zeros((HEIGHT, WIDTH), np.uint8)
    mask[4:20, 12:28] = 255
    return mask


def runner_draws() -> tuple[np.ndarray, np.ndarray]:
    """Per device, the runner's noise (NCHW) and its posterior sample's standard normal (NCHW)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(SEED), NUM_DEVICES)
    side = HEIGHT // 8
    noise = [np.asarray(jax.random.normal(key, (1, 16, side, side), dtype=jnp.float32)) for key in keys]
    eps = [np.asarray(jax.random.normal(key, (1, side, side, 16), dtype=jnp.float32)).transpose(0, 3, 1, 2)
           for key in keys]
    return np.concatenate(noise), np.concatenate(eps)


def control_image() -> np.ndarray:
    """A fixed 32x32 edge map, as a Canny detector draws one: white one-pixel outlines of a square and a diagonal on
    black, RGB uint8."""
    edges = np.zeros((HEIGHT, WIDTH), np.uint8)
    edges[6, 6:26] = edges[25, 6:26] = edges[6:26, 6] = edges[6:26, 25] = 255
    for i in range(10, 22):
        edges[i, i] = 255
    return np.repeat(edges[:, :, None], 3, axis=2)


def control_folder(out: Path, transformer: Path = CONTROL_TRANSFORMER) -> Path:
    """tiny-flux-dev with ``transformer`` (Canny/Depth's shape) and an index naming FluxControlPipeline, at ``out``."""
    return fill_folder(out, transformer, "FluxControlPipeline")


def control_images(pipeline, picture: np.ndarray, noise: np.ndarray, eps: np.ndarray, module_name: str = "",
                   guidance: float = VARIANTS["dev"]["guidance_scale"], **inputs) -> np.ndarray:
    """FluxControlPipeline's image for each device's draws (the noise through the pipeline module's ``randn_tensor``,
    the control image's posterior sample through ``DiagonalGaussianDistribution.sample``) -- or, with ``module_name``
    (the pipeline's module under diffusers.pipelines, e.g. ``flux.pipeline_flux_controlnet``), its ``guidance`` and
    ``inputs`` (image, mask_image, strength, ...: pictures as arrays), another pipeline's: FluxControlImg2ImgPipeline's,
    FluxControlInpaintPipeline's (the init image's sample the same draw, as the runner's), FluxControlNetPipeline's,
    StableDiffusion3ControlNetPipeline's (its control image's sample, both guidance halves', the draw) and
    StableDiffusion3ControlNetInpaintingPipeline's (its masked image's)."""
    import importlib

    import torch
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from PIL import Image

    module = importlib.import_module(f"diffusers.pipelines.{module_name or 'flux.pipeline_flux_control'}")
    inputs = {k: Image.fromarray(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}
    images = []
    for device in range(NUM_DEVICES):
        def given_noise(shape, generator=None, device_=None, dtype=None, layout=None, at=device, **_):
            assert tuple(shape) == noise[at:at + 1].shape, shape
            return torch.from_numpy(noise[at:at + 1]).to(dtype=dtype)

        def given_sample(dist, generator=None, at=device):
            return dist.mean + dist.std * torch.from_numpy(eps[at:at + 1]).to(dist.mean.dtype)

        saved = module.randn_tensor, DiagonalGaussianDistribution.sample
        module.randn_tensor, DiagonalGaussianDistribution.sample = given_noise, given_sample
        try:
            with torch.no_grad():
                image = pipeline(prompt=PROMPT, control_image=Image.fromarray(picture), num_inference_steps=STEPS,
                                 guidance_scale=guidance, height=HEIGHT, width=WIDTH,
                                 max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="np", **inputs).images[0]
        finally:
            module.randn_tensor, DiagonalGaussianDistribution.sample = saved
        images.append(np.asarray(image, dtype=np.float32))
    return np.stack(images)


def flux_controlnet(out: Path, seed: int = CONTROLNET_SEED, num_mode: int | None = None, **shape) -> None:
    """The tiny FluxControlNetModel (:data:`CONTROLNET`; with ``num_mode``, a union model; ``shape``: other config
    values, :data:`XLABS_SHAPE`), saved to ``out``."""
    import torch
    from diffusers import FluxControlNetModel

    config = json.loads((FLUX_FOLDER / "transformer" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_") and k != "out_channels"}
    torch.manual_seed(seed)
    net = FluxControlNetModel(**{**config, "num_layers": 1, "num_single_layers": 1, "num_mode": num_mode, **shape})
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if name.startswith(("controlnet_blocks", "controlnet_single_blocks", "controlnet_x_embedder",
                                "input_hint_block.conv_out")):
                parameter.copy_(torch.randn_like(parameter) * 0.2)

    net.save_pretrained(out, safe_serialization=True)


def controlnet_images(pipeline, picture: np.ndarray, scale: float, noise: np.ndarray, eps: np.ndarray,
                      control_mode: int | None = None, **window) -> np.ndarray:
    """FluxControlNetPipeline's image for each device's draws at conditioning scale ``scale`` (and a union model's
    ``control_mode``), as :func:`control_images` calls a pipeline (its ``retrieve_latents`` draws the control image's
    posterior sample through ``DiagonalGaussianDistribution.sample`` too)."""
    return control_images(pipeline, picture, noise, eps, "flux.pipeline_flux_controlnet",
                          controlnet_conditioning_scale=scale, control_mode=control_mode, **window)


def union_call(controlnet) -> dict[str, np.ndarray]:
    """The union ControlNet's own outputs for fixed random inputs (``call_*``, numpy seed UNION_SEED) at each of its
    modes (``call_double_M``, ``call_single_M``: its residuals at conditioning scale 1): how the mode token steers it,
    which the images (one token among the prompt's) show only faintly."""
    import torch

    rng = np.random.default_rng(UNION_SEED)
    config = controlnet.config
    tokens, text = 16, 8
    inputs = {"hidden_states": rng.standard_normal((1, tokens, config.in_channels)),
              "controlnet_cond": rng.standard_normal((1, tokens, config.in_channels)),
              "encoder_hidden_states": rng.standard_normal((1, text, config.joint_attention_dim)),
              "pooled_projections": rng.standard_normal((1, config.pooled_projection_dim)),
              "timestep": np.asarray([0.6]), "guidance": np.asarray([3.5]),
              "img_ids": np.stack([np.zeros(tokens), np.arange(tokens) // 4, np.arange(tokens) % 4], axis=1),
              "txt_ids": np.zeros((text, 3))}
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    out = {f"call_{k}": v for k, v in inputs.items()}
    for mode in range(UNION_MODES):
        with torch.no_grad():
            double, single = controlnet(**{k: torch.from_numpy(v) for k, v in inputs.items()},
                                        controlnet_mode=torch.tensor([[mode]]), conditioning_scale=1.0,
                                        return_dict=False)
        out[f"call_double_{mode}"] = np.stack([d.numpy() for d in double])
        out[f"call_single_{mode}"] = np.stack([s.numpy() for s in single])
    return out


def with_controlnet(base, controlnet_class: str, folder: Path, pipeline_class: str):
    """Pipeline ``pipeline_class`` of ``base``'s components and the ControlNet (diffusers' ``controlnet_class``) at
    ``folder``, its parameters copied to aligned memory (load_aligned's reason), no progress bar."""
    import diffusers
    import torch

    controlnet = getattr(diffusers, controlnet_class).from_pretrained(folder, torch_dtype=torch.float32)
    for parameter in controlnet.parameters():
        parameter.data = parameter.data.clone()
    made = getattr(diffusers, pipeline_class)(controlnet=controlnet, **base.components)
    made.set_progress_bar_config(disable=True)
    return made


def write_controlnet(out_dir: Path, noise: np.ndarray, eps: np.ndarray) -> None:
    """``flux_controlnet.npz`` (``images_S`` per conditioning scale S, one per device, and ``plain``: scale 0) and the
    ControlNet it ran (:data:`CONTROLNET`), on :func:`control_image` (``control.png``)."""
    base = load_aligned("FluxPipeline", FLUX_FOLDER)

    def pipeline_with(folder: Path):
        return with_controlnet(base, "FluxControlNetModel", folder, "FluxControlNetPipeline")

    flux_controlnet(out_dir / CONTROLNET.name)
    pipeline = pipeline_with(out_dir / CONTROLNET.name)
    edges = control_image()
    out = dict(run_settings(VARIANTS["dev"]["guidance_scale"]), scales=np.asarray(CONTROLNET_SCALES))
    for scale in CONTROLNET_SCALES:
        out[f"images_{scale:g}"] = controlnet_images(pipeline, edges, scale, noise, eps)
    out["plain"] = controlnet_images(pipeline, edges, 0.0, noise, eps)
    out["window"] = np.asarray(CONTROL_WINDOW)
    out["window_1"] = controlnet_images(pipeline, edges, 1.0, noise, eps, control_guidance_start=CONTROL_WINDOW[0],
                                        control_guidance_end=CONTROL_WINDOW[1])
    print(f"controlnet: largest difference between scales 0 and 1 {np.abs(out['images_1'] - out['plain']).max():.4f}")
    flux_controlnet(out_dir / UNION.name, UNION_SEED, UNION_MODES)
    union = pipeline_with(out_dir / UNION.name)
    out["union_modes"] = np.asarray(UNION_RUN)
    for mode in UNION_RUN:
        out[f"union_{mode}"] = controlnet_images(union, edges, 1.0, noise, eps, control_mode=mode)
    print(f"controlnet: union modes {UNION_RUN} differ by {np.abs(out['union_1'] - out['union_3']).max():.4f}")
    out.update(union_call(union.controlnet))
    flux_controlnet(out_dir / XLABS.name, XLABS_SEED, **XLABS_SHAPE)
    out["xlabs_1"] = controlnet_images(pipeline_with(out_dir / XLABS.name), edges, 1.0, noise, eps)
    print(f"controlnet: XLabs' kind differs from the first by {np.abs(out['xlabs_1'] - out['images_1']).max():.4f} "
          f"and from scale 0 by {np.abs(out['xlabs_1'] - out['plain']).max():.4f}")
    _save_npz(out_dir / "flux_controlnet.npz", out)


def sd3_controlnet(out: Path, seed: int, **kind) -> None:
    """A tiny SD3ControlNetModel (:data:`SD3_CONTROLNET`; with ``kind`` :data:`SD3_SINGLE`, SD 3.5 Large's), saved to
    ``out``."""
    import inspect

    import torch
    from diffusers import SD3ControlNetModel

    config = json.loads((SD3_FOLDER / "transformer" / "config.json").read_text())
    accepted = inspect.signature(SD3ControlNetModel.__init__).parameters
    config = {k: v for k, v in config.items() if k in accepted}
    torch.manual_seed(seed)
    net = SD3ControlNetModel(**dict(config, num_layers=2, **kind))
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if name.startswith(("controlnet_blocks", "pos_embed_input")):
                parameter.copy_(torch.randn_like(parameter) * 0.2)
    net.save_pretrained(out, safe_serialization=True)


def sd3_controlnet_images(pipeline, picture: np.ndarray, scale: float, noise: np.ndarray, eps: np.ndarray,
                          module_name: str = "pipeline_stable_diffusion_3_controlnet", **inputs) -> np.ndarray:
    """StableDiffusion3ControlNetPipeline's image for each device's draws at conditioning scale ``scale`` (or, with
    ``module_name`` and ``inputs``, StableDiffusion3ControlNetInpaintingPipeline's), as :func:`control_images` calls a
    pipeline."""
    return control_images(pipeline, picture, noise, eps, f"controlnet_sd3.{module_name}", SD3_GUIDANCE,
                          controlnet_conditioning_scale=scale, **inputs)


def sd3_controlnet_call(controlnet, prefix: str, tokens_in: bool) -> dict[str, np.ndarray]:
    """A ControlNet's own residuals for fixed random inputs (numpy seed SD3_CONTROLNET_SEED; ``PREFIX_*``): NCHW
    latents -- or, ``tokens_in`` (no position embedding of its own), tokens of its width -- the control latents, the
    text (where it reads it), the pooled text and the timestep; its residuals at conditioning scale 0.5."""
    import torch

    rng = np.random.default_rng(SD3_CONTROLNET_SEED)
    config, side, text = controlnet.config, 4, 6
    width = config.num_attention_heads * config.attention_head_dim
    hidden = (1, (side // config.patch_size) ** 2, width) if tokens_in else (1, config.in_channels, side, side)
    inputs = {"hidden_states": rng.standard_normal(hidden),
              "controlnet_cond": rng.standard_normal((1, config.in_channels, side, side)),
              "pooled_projections": rng.standard_normal((1, config.pooled_projection_dim)),
              "timestep": np.asarray([600.0])}
    if config.joint_attention_dim is not None:
        inputs["encoder_hidden_states"] = rng.standard_normal((1, text, config.joint_attention_dim))
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    with torch.no_grad():
        samples = controlnet(**{k: torch.from_numpy(v) for k, v in inputs.items()}, conditioning_scale=0.5,
                             return_dict=False)[0]
    out = {f"{prefix}_{k}": v for k, v in inputs.items()}
    out[f"{prefix}_residuals"] = np.stack([sample.numpy() for sample in samples])
    return out


def write_sd3_controlnet(out_dir: Path, noise: np.ndarray, eps: np.ndarray) -> None:
    """``sd3_controlnet.npz`` and the ControlNets it ran (module docstring), on :func:`control_image`."""
    import diffusers

    base = load_aligned("StableDiffusion3Pipeline", SD3_FOLDER)

    def pipeline_with(folder: Path, pipeline_class: str = "StableDiffusion3ControlNetPipeline"):
        return with_controlnet(base, "SD3ControlNetModel", folder, pipeline_class)

    edges = control_image()
    out = dict(run_settings(SD3_GUIDANCE), scales=np.asarray(CONTROLNET_SCALES))
    sd3_controlnet(out_dir / SD3_CONTROLNET.name, SD3_CONTROLNET_SEED)
    out.update(sd3_controlnet_call(diffusers.SD3ControlNetModel.from_pretrained(out_dir / SD3_CONTROLNET.name),
                                   "call", tokens_in=False))
    pipeline = pipeline_with(out_dir / SD3_CONTROLNET.name)
    for scale in CONTROLNET_SCALES:
        out[f"images_{scale:g}"] = sd3_controlnet_images(pipeline, edges, scale, noise, eps)
    out["plain"] = sd3_controlnet_images(pipeline, edges, 0.0, noise, eps)
    out["window"] = np.asarray(CONTROL_WINDOW)
    out["window_1"] = sd3_controlnet_images(pipeline, edges, 1.0, noise, eps, control_guidance_start=CONTROL_WINDOW[0],
                                            control_guidance_end=CONTROL_WINDOW[1])
    print(f"sd3 controlnet: the window's images differ from scale 1's by {np.abs(out['window_1'] - out['images_1']).max():.4f}"
          f" and from scale 0's by {np.abs(out['window_1'] - out['plain']).max():.4f}")
    print(f"sd3 controlnet: largest difference between scales 0 and 1 {np.abs(out['images_1'] - out['plain']).max():.4f}")
    sd3_controlnet(out_dir / SD3_CONTROLNET_SINGLE.name, SD3_CONTROLNET_SEED + 1, **SD3_SINGLE)
    out.update(sd3_controlnet_call(diffusers.SD3ControlNetModel.from_pretrained(out_dir / SD3_CONTROLNET_SINGLE.name),
                                   "single_call", tokens_in=True))
    single = pipeline_with(out_dir / SD3_CONTROLNET_SINGLE.name)
    out["single_1"] = sd3_controlnet_images(single, edges, 1.0, noise, eps)
    print(f"sd3 controlnet: the two kinds differ by {np.abs(out['single_1'] - out['images_1']).max():.4f}")
    sd3_controlnet(out_dir / SD3_CONTROLNET_INPAINT.name, SD3_CONTROLNET_SEED + 2, extra_conditioning_channels=1)
    inpainting = pipeline_with(out_dir / SD3_CONTROLNET_INPAINT.name, "StableDiffusion3ControlNetInpaintingPipeline")
    out["inpaint_1"] = sd3_controlnet_images(inpainting, init_image(), 1.0, noise, eps,
                                             "pipeline_stable_diffusion_3_controlnet_inpainting",
                                             control_mask=mask_image())
    print(f"sd3 controlnet: the inpainting one differs from scale 0 by {np.abs(out['inpaint_1'] - out['plain']).max():.4f}")
    _save_npz(out_dir / "sd3_controlnet.npz", out)


def run_settings(guidance: float) -> dict[str, np.ndarray]:
    """The settings a reference ran with, as its .npz holds them (the test runs the runner on them)."""
    return {"prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS, dtype=np.int64),
            "guidance_scale": np.asarray(guidance, dtype=np.float64),
            "height": np.asarray(HEIGHT, dtype=np.int64), "width": np.asarray(WIDTH, dtype=np.int64),
            "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH, dtype=np.int64),
            "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64)}


def write_control(out_dir: Path, noise: np.ndarray, eps: np.ndarray) -> None:
    """``flux_control.npz``, ``control.png`` and the transformer it ran (module docstring)."""
    import tempfile

    from PIL import Image

    transformer = out_dir / CONTROL_TRANSFORMER.name
    fill_transformer(transformer, CONTROL_SEED, in_channels=128)
    with tempfile.TemporaryDirectory() as staging:
        pipeline = load_aligned("FluxControlPipeline", control_folder(Path(staging) / "tiny-flux-control", transformer))
        edges = control_image()
        out = dict(run_settings(VARIANTS["dev"]["guidance_scale"]), images=control_images(pipeline, edges, noise, eps),
                   control_images=control_images(pipeline, 255 - edges, noise, eps))
        folder = control_folder(Path(staging) / "tiny-flux-control-modes", transformer)
        img2img = load_aligned("FluxControlImg2ImgPipeline", folder)
        for strength in CONTROL_STRENGTHS:
            out[f"img2img_{strength:g}"] = control_images(img2img, edges, noise, eps, "flux.pipeline_flux_control_img2img",
                                                          image=init_image(), strength=strength)
        inpaint = load_aligned("FluxControlInpaintPipeline", folder)
        out[f"inpaint_{CONTROL_INPAINT:g}"] = control_images(
            inpaint, edges, noise, eps, "flux.pipeline_flux_control_inpaint", image=init_image(), mask_image=mask_image(),
            strength=CONTROL_INPAINT)
    print(f"control: largest difference between the edge map and its inverse "
          f"{np.abs(out['images'] - out['control_images']).max():.4f}")
    _save_npz(out_dir / "flux_control.npz", out)
    Image.fromarray(edges).save(out_dir / "control.png")


def fill_transformer(out: Path, seed: int = FILL_SEED, in_channels: int = 384) -> None:
    """A tiny random FluxTransformer2DModel of Fill's shape (tiny-flux-dev's with 384 channels in, 64 out; Canny/Depth's
    with ``in_channels`` 128), saved to ``out`` (config.json and diffusion_pytorch_model.safetensors)."""
    import torch
    from diffusers import FluxTransformer2DModel

    config = json.loads((FLUX_FOLDER / "transformer" / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    torch.manual_seed(seed)
    FluxTransformer2DModel(**dict(config, in_channels=in_channels, out_channels=64)).save_pretrained(
        out, safe_serialization=True)


def fill_folder(out: Path, transformer: Path = FILL_TRANSFORMER, pipeline_class: str = "FluxFillPipeline") -> Path:
    """tiny-flux-dev with ``transformer`` (Fill's shape) and an index naming ``pipeline_class``, at ``out``."""
    import shutil

    shutil.copytree(FLUX_FOLDER, out)
    shutil.rmtree(out / "transformer")  # (tiny-flux-dev's is split in shards)
    shutil.copytree(transformer, out / "transformer")
    index = json.loads((out / "model_index.json").read_text())
    (out / "model_index.json").write_text(json.dumps(dict(index, _class_name=pipeline_class), indent=2) + "\n")
    return out


def _load(case: tuple[str, str], fill: Path | None = None):
    folder, name, _, _ = PIPELINES[case]
    return load_aligned(name, folder or fill)


def _call(case: tuple[str, str], pipeline, picture, strength: float, noise: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """One image at ``strength`` from the runner's draws for one device (inpaint: with :func:`mask_image`)."""
    import importlib

    import torch
    from PIL import Image

    _, _, module_name, guidance = PIPELINES[case]
    masked = {"mask_image": Image.fromarray(mask_image())} if case[1] in ("inpaint", "fill") else {}
    module = importlib.import_module(f"diffusers.pipelines.{module_name}")

    def given_noise(shape, generator=None, device=None, dtype=None, layout=None):
        assert tuple(shape) == noise.shape, (shape, noise.shape)
        return torch.from_numpy(noise).to(dtype=dtype)

    def given_sample(encoder_output, generator=None, sample_mode="sample"):
        dist = encoder_output.latent_dist
        return dist.mean + dist.std * torch.from_numpy(eps).to(dist.mean.dtype)

    saved = module.randn_tensor, module.retrieve_latents
    module.randn_tensor, module.retrieve_latents = given_noise, given_sample
    shift_forgotten = case == ("sd3", "inpaint")  # see the module's docstring
    try:
        with torch.no_grad():
            images = pipeline(prompt=PROMPT, image=Image.fromarray(picture), **masked, strength=strength,
                              num_inference_steps=STEPS, guidance_scale=guidance,
                              height=HEIGHT, width=WIDTH, max_sequence_length=MAX_SEQUENCE_LENGTH,
                              output_type="latent" if shift_forgotten else "np").images
            if shift_forgotten:
                config = pipeline.vae.config
                decoded = pipeline.vae.decode(images / config.scaling_factor + config.shift_factor, return_dict=False)[0]
                images = pipeline.image_processor.postprocess(decoded, output_type="np")
    finally:
        module.randn_tensor, module.retrieve_latents = saved
    return np.asarray(images[0], dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    from PIL import Image

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the fixture folder")
    parser.add_argument("--only", choices=("control", "controlnet", "sd3_controlnet"),
                        help="write only FLUX.1 Canny/Depth's (control), the FLUX.1 ControlNet's (controlnet) or the SD 3 "
                        "ControlNets' (sd3_controlnet) reference")
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    import tempfile

    picture = init_image()
    noise, eps = runner_draws()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "controlnet"):
        write_controlnet(args.out, noise, eps)
    if args.only in (None, "control"):
        write_control(args.out, noise, eps)
    if args.only in (None, "sd3_controlnet"):
        write_sd3_controlnet(args.out, noise, eps)
    if args.only is not None:
        (args.out / "VERSIONS.json").write_text(json.dumps(_versions(), indent=2) + "\n", encoding="utf-8")
        return 0
    fill_transformer(args.out / FILL_TRANSFORMER.name)
    staging = tempfile.TemporaryDirectory()
    fill = fill_folder(Path(staging.name) / "tiny-flux-fill", args.out / FILL_TRANSFORMER.name)
    for case, (_, _, _, guidance) in PIPELINES.items():
        pipeline = _load(case, fill)
        out = dict(run_settings(guidance), strengths=np.asarray(STRENGTHS, dtype=np.float64))
        for strength in STRENGTHS:
            out[f"images_{strength:g}"] = np.stack([
                _call(case, pipeline, picture, strength, noise[i:i + 1], eps[i:i + 1]) for i in range(NUM_DEVICES)])
        print(f"{case}: largest difference between strengths 0.3 and 0.6 "
              f"{np.abs(out['images_0.3'] - out['images_0.6']).max():.4f}")
        _save_npz(args.out / f"{case[0]}_{case[1]}.npz", out)
    staging.cleanup()
    Image.fromarray(picture).save(args.out / "init.png")
    Image.fromarray(mask_image()).save(args.out / "mask.png")
    (args.out / "VERSIONS.json").write_text(json.dumps(_versions(), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
