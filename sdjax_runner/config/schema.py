"""The structured config schema: every key a run accepts, with its type.

Hydra merges the YAML files under ``sdjax_runner/conf/`` onto these dataclasses,
so a misspelled key or a value of the wrong type fails at compose time, before
anything is loaded. Value *ranges* (multiples of 8, positive counts, ...) are
checked in :mod:`sdjax_runner.config.checks`. The YAML files document each key.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class Dtype(Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class ParallelMode(Enum):
    pmap = "pmap"  # the guide's path: replicate + shard + jax.pmap
    sharded = "sharded"  # one jax.jit over a Mesh("data"), NamedSharding params and batch


class ParamsPlacement(Enum):
    replicated = "replicated"  # every device holds the whole weights (the guide's)
    sharded = "sharded"  # each device holds 1/N of every large weight, gathered where it is used (engine/sharded.py)


class GenerationMode(Enum):
    txt2img = 0  # from noise
    img2img = 1  # from init_image, noised to `strength`
    inpaint = 2  # repaint the mask_image's white area of init_image
    controlnet = 3  # from noise, steered by controlnet.image through controlnet.model
    edit = 4  # from noise, init_image's tokens beside the noise's in each call (FLUX.1 Kontext)
    control = 5  # from noise, controlnet.image's latents beside the latents in each call (FLUX.1 Canny/Depth [dev])
    control_img2img = 6  # control's, from init_image noised to `strength`
    control_inpaint = 7  # control_img2img's, repainting the mask_image's white area
    # from noise, steered by an inpainting ControlNet (controlnet.model) reading init_image with mask_image's white
    # area masked out, and the mask (SD 3's: alimama-creative/SD3-Controlnet-Inpainting)
    controlnet_inpaint = 8


class ResizeMode(Enum):
    stretch = 0  # to height x width, aspect ratio not kept (diffusers' image processor, A1111's "Just resize")
    crop = 1  # scaled to cover height x width, then centre-cropped (A1111's "Crop and resize")


class PromptSyntax(Enum):
    plain = "plain"  # the guide's: the text as it is, cut at 77 tokens
    a1111 = "a1111"  # A1111's: (emphasis:1.3), [less], BREAK, prompts of any length in 75-token chunks


class PromptFill(Enum):
    cycle = "cycle"  # repeat the prompt list to fill the last batch; every image is kept
    pad = "pad"  # fill the last batch with copies too, but drop those images from the outputs


class PredictionType(Enum):
    epsilon = "epsilon"  # the UNet predicts the noise (SD 1.x, SD 2.x base, SDXL)
    v_prediction = "v_prediction"  # the UNet predicts v (SD 2.x 768)
    sample = "sample"


class HiresUpscaler(Enum):
    # Hires. fix's upscalers (sampling.hires.upscaler), A1111's names in config/hires.py. The latent ones resize the
    # first pass's latents as torch.nn.functional.interpolate does for A1111's "Latent" variants:
    latent = 0  # "Latent": bilinear
    latent_antialiased = 1  # "Latent (antialiased)": bilinear, antialiased
    latent_bicubic = 2  # "Latent (bicubic)": bicubic (a = -0.75)
    latent_bicubic_antialiased = 3  # "Latent (bicubic antialiased)": bicubic, antialiased (a = -0.5)
    latent_nearest = 4  # "Latent (nearest)"
    latent_nearest_exact = 5  # "Latent (nearest-exact)"
    # "Lanczos": the first pass decoded to 8-bit pixels, resized as Pillow's LANCZOS does, encoded again
    lanczos = 6


class Attention(Enum):
    default = "default"  # diffusers' FlaxAttention as shipped
    split_head_dim = "split_head_dim"  # diffusers' option: heads as their own axis
    memory_efficient = "memory_efficient"  # diffusers' chunked attention
    dot_product = "dot_product"  # jax.nn.dot_product_attention, XLA implementation
    cudnn_flash = "cudnn_flash"  # jax.nn.dot_product_attention on cuDNN flash attention (NVIDIA, bf16)


class TrackingBackend(Enum):
    mlflow = "mlflow"
    none = "none"


# Names a run may pick whose implementations live in a lower layer; each of those registries is
# checked against these lists when it is imported, so the two cannot drift apart.
BUILTIN_MODELS = ("tiny-random", "tiny-random-xl", "sd-v1-arch", "sdxl-arch", "tiny-random-inpaint", "tiny-random-clip",
                  "tiny-random-controlnet", "tiny-random-flux", "tiny-random-flux-schnell", "tiny-random-flux-kontext",
                  "tiny-random-flux-fill", "tiny-random-flux-control", "tiny-random-flux-controlnet",
                  "tiny-random-flux-controlnet-union",
                  "flux-dev-arch", "tiny-random-sd3", "tiny-random-sd3-controlnet", "tiny-random-sd3-controlnet-single",
                  "tiny-random-sd3-controlnet-inpaint", "sd3.5-large-arch", "tiny-random-flux2",
                  "tiny-random-flux2-base", "flux2-klein-4b-arch", "flux2-klein-9b-arch")  # models/builtin.py
# scheduler.name -> the diffusers Flax class whose settings it takes (scheduler.config_overrides); the
# classes that run are in models/schedulers.py (LMS and DDPM are the project's own subclasses).
SCHEDULERS = {"pndm": "FlaxPNDMScheduler", "ddim": "FlaxDDIMScheduler", "lms": "FlaxLMSDiscreteScheduler",
              "dpm_solver_pp": "FlaxDPMSolverMultistepScheduler", "euler": "FlaxEulerDiscreteScheduler",
              "ddpm": "FlaxDDPMScheduler",
              "lcm": "FlaxDDIMScheduler"}  # diffusers' PyTorch LCMScheduler: DDIM's settings and two of its own


@dataclass
class ModelConfig:
    name: str = MISSING  # names the model in run names, image metadata and the console
    # A diffusers-format pipeline directory, or a hub id (fetched with snapshot_download, or read from
    # the local Hugging Face cache when offline). With a checkpoint: the base model that gives configs,
    # tokenizers and scheduler (only those are fetched); null picks the standard base of the
    # checkpoint's architecture (SD 1.5, SD 2.1, SDXL base 1.0, FLUX.1 [dev]/[schnell], SD 3 / 3.5).
    pretrained_model_name_or_path: Optional[str] = MISSING
    # A single-file checkpoint (.safetensors: SD 1.x/2.x/XL in the original LDM layout as model sites and A1111 /
    # ComfyUI have them, FLUX.1 in Black Forest Labs' layout, SD 3 / 3.5 in Stability AI's): the weights it holds
    # are used, converted without torch.
    checkpoint: Optional[str] = None
    # Another VAE (A1111's "SD VAE"): a diffusers VAE folder (its own config.json) or one .safetensors file in the
    # original layout (vae-ft-mse-840000-ema-pruned.safetensors, sdxl_vae.safetensors, FLUX.1's ae.safetensors),
    # which runs on the model's VAE config. Pickled files are refused. A sweep over it reloads only the VAE.
    vae: Optional[str] = None
    # SDXL's refiner (A1111's "Refiner", diffusers' base + refiner "ensemble of experts"): a diffusers folder laid out as
    # stabilityai/stable-diffusion-xl-refiner-1.0 (model_index.json, unet/, text_encoder_2/, tokenizer_2/) that takes
    # over from the base at sampling.refiner_switch. Its UNet and second text encoder are read (Flax or PyTorch
    # safetensors); the run's VAE decodes (the refiner ships the base's). null: none. Text to image and image to image.
    refiner: Optional[str] = None
    revision: Optional[str] = None  # a hub branch, tag or commit
    # Selects PyTorch safetensors diffusion_pytorch_model.<variant>.safetensors (e.g. fp16) where a
    # component has no Flax weights; diffusers' Flax loader reads the Flax file whatever the variant.
    variant: Optional[str] = None
    # Run the pipeline's safety checker (SD 1.x repositories with safety_checker/ and feature_extractor/).
    safety_checker: bool = False
    # Load and run the folder's T5 text encoder (SD 3 / 3.5). false: without it, as diffusers' text_encoder_3=None
    # (T5's part of the conditioning is zeros; its 4.7B parameters are not read). FLUX.1 needs its T5; the SD
    # family has none. A folder without text_encoder_3/ runs without T5 either way.
    t5: bool = True
    # A built-in model (models/builtin.py) built once at pretrained_model_name_or_path if it is not there.
    builtin: Optional[str] = None
    resolution: Optional[int] = None  # native height/width; null: the UNet's sample_size x 8
    # null: as the model's scheduler config says; set it for v-prediction models (SD 2.x 768) so that
    # whatever scheduler is chosen predicts the same thing the UNet was trained on.
    prediction_type: Optional[PredictionType] = None
    # Read a folder's .bin/.ckpt pickles (PyTorch's zip format) with the runner's restricted reader, which imports
    # and runs nothing from the file (models/torch_pickle.py; no torch). Off: pickles are refused, as a pickle is code.
    allow_pickle: bool = False
    # The model family (config/families.py): sd (SD 1.x/2.x/XL), flux (FLUX.1) or sd3 (SD 3 / 3.5). null: read from the folder's
    # model_index.json when it is on disk (a local folder, a built-in model), else sd. Set it for a hub id
    # that is not in the catalogue; a loaded model of another family is refused in one line.
    family: Optional[str] = None


@dataclass
class DtypeConfig:
    name: str = MISSING  # the option's name (fp32, bf16, fp16): in run names and records
    weights_dtype: Dtype = Dtype.float32  # params of UNet, VAE and text encoder are cast to this
    activations_dtype: Dtype = Dtype.float32  # the modules compute in this dtype (from_pretrained's dtype=)
    # The scheduler state is always float32 (a bf16 state gives black images or NaNs).


@dataclass
class SchedulerConfig:
    # pndm, ddim, lms, dpm_solver_pp, euler, ddpm (diffusers' schedulers: models/schedulers.py), or a
    # k sampler's sigma schedule: normal, karras, exponential, sgm_uniform, simple (with sampler=NAME)
    name: str = MISSING
    # The scheduler is built from the model's own scheduler config; these entries replace entries of it
    # (e.g. steps_offset, timestep_spacing, prediction_type). Unknown keys, and values the scheduler cannot
    # run with (a count of 0, an unknown beta_schedule: config/checks.py), fail before anything loads.
    config_overrides: Dict[str, Any] = field(default_factory=dict)


@dataclass
class PromptsConfig:
    name: str = MISSING  # the prompts option's name (guide_single, guide_eight, ...)
    # Each prompt (here, in the file or negative) is at most 10,000 characters (config/prompts.py).
    texts: List[str] = field(default_factory=list)
    # A UTF-8 text file, one prompt per line (blank lines skipped). Given on the command line, the
    # run's prompts are exactly the file's (plus prompts.texts only if those are given there too).
    file: Optional[str] = None
    # A built-in prompt set for evaluation (config/prompt_sets.py): parti (PartiPrompts, 1,632 prompts in 12
    # categories; Apache-2.0). Its prompts follow prompts.texts and prompts.file's; given on the command line, the
    # run's prompts are exactly the set's (as with prompts.file). prompts=parti selects it with a sample of 64.
    set: Optional[str] = None
    categories: List[str] = field(default_factory=list)  # the set's categories to keep ([Animals, Vehicles]); []: all
    # How many of the set's (kept) prompts, drawn without replacement by sample_seed and kept in the set's order;
    # null: all of them.
    sample: Optional[int] = None
    sample_seed: int = 0  # the seed of the sample's draw (NumPy's default_rng): the same prompts on every machine
    negative: Optional[str] = None  # negative prompt for every image (null: the empty prompt, as in the guide)
    # How a prompt list that does not fill the last batch is completed: cycle (repeat the list; all
    # images kept) or pad (the fillers are generated to keep shapes static, then dropped).
    fill: PromptFill = PromptFill.cycle
    # A1111's "Clip skip" for SD 1.x/2.x: the text encoder layer whose output conditions the UNet, counted
    # from the last (1: the last layer, the guide's; 2: the one before it, then the final layer norm, as
    # A1111 does). SDXL reads its penultimate layer by design and takes 1 only. Shapes the program.
    clip_skip: int = 1
    # How a prompt is read: plain (the guide's: literal text, cut at 77 tokens; the default, so the guide's
    # images stay the guide's) or a1111 (AUTOMATIC1111's syntax: "(word)" x1.1, "(word:1.3)", "[word]"
    # /1.1, "\(" a literal bracket, BREAK, and prompts longer than 77 tokens encoded in 75-token chunks, at
    # most 20 per prompt). The negative prompt is read the same way.
    syntax: PromptSyntax = PromptSyntax.plain
    # FLUX.1 and SD 3: how many T5 tokens a prompt is read as (padded and cut; diffusers' max_sequence_length),
    # 1..512. null: diffusers' default, 512 for FLUX.1, 256 for SD 3. Shapes the program. SD 1.x/2.x/XL models
    # have no T5 encoder: refused there.
    max_sequence_length: Optional[int] = None
    # Textual-inversion embeddings (A1111's embeddings folder): .safetensors files, or folders of them (searched
    # recursively), each named by its file stem; a prompt or negative prompt that names one gets its vectors
    # (A1111's emb_params / diffusers' <token> for SD 1.x/2.x, clip_l + clip_g for SDXL). Pickled .pt/.bin files
    # are refused. SD family only.
    embeddings: List[str] = field(default_factory=list)


@dataclass
class LoraConfig:
    # A LoRA adapter (.safetensors; kohya lora_unet_/lora_te_ or PEFT/diffusers unet./text_encoder.
    # keys, with alpha), merged into the UNet and text encoder kernels it names.
    path: str = MISSING
    # Strength: kernel + scale * alpha/rank * B @ A. A traced input: a sweep over it compiles once.
    scale: float = 1.0


@dataclass
class HiresConfig:
    # A1111's "Hires. fix", text to image in the SD family: the image is made at sampling.height x width, upscaled
    # to int(side * scale) (a multiple of the model's down-sampling) and denoised again there, image to image, in
    # the same compiled program; the run's images are the upscaled ones. null: none (one pass).
    scale: Optional[float] = None  # A1111's "Hires upscale": 1 .. 4
    # The second pass's steps, as A1111 counts them ("Hires steps"): these many run, at the end of a schedule of
    # int(steps / min(denoising_strength, 0.999)) steps. null: sampling.num_inference_steps (A1111's 0).
    steps: Optional[int] = None
    # A1111's "Denoising strength" of the second pass, in (0, 1]. It shapes the schedule: a sweep over it compiles
    # a program per value.
    denoising_strength: float = 0.7
    upscaler: HiresUpscaler = HiresUpscaler.latent  # "Hires upscaler" (A1111's default, "Latent")
    # A1111's "Hires sampler": a k sampler by its A1111 / ComfyUI name ("DPM++ 2M Karras", "Euler a") for the second
    # pass, on the run's sigma schedule unless the name carries one, at its default eta. null: the run's sampler.
    sampler: Optional[str] = None
    # A1111's "Hires CFG Scale": the second pass's guidance scale. null: sampling.guidance_scale. A traced value.
    guidance_scale: Optional[float] = None


@dataclass
class SamplingConfig:
    # null: the model family's default (config/families.py): diffusers' pipelines' own -- 50 steps and
    # guidance 7.5 for Stable Diffusion (the guide's), 28 and 3.5 for FLUX.1.
    num_inference_steps: Optional[int] = None  # denoising steps (>= 1); changing it recompiles
    # Stable Diffusion: the classifier-free guidance weight; at 1 or less none runs (the conditional prediction
    # alone, one UNet batch a step, as diffusers' PyTorch pipelines: SDXL Turbo's 0). FLUX.1 [dev]: its distilled
    # guidance (the value the transformer embeds, diffusers' guidance_scale, Forge's "Distilled CFG Scale");
    # [schnell] takes none (refused unless null). A traced value: a sweep over it does not recompile (SD: on each
    # side of 1).
    guidance_scale: Optional[float] = None
    # FLUX.1 [dev]: true classifier-free guidance (diffusers' true_cfg_scale, Forge's "CFG scale" on FLUX): with
    # prompts.negative and a value over 1 the transformer also runs on the negative prompt, mixed as neg + scale *
    # (pos - neg) -- two transformer calls a step (a guider other than cfg combines the two instead). null: none
    # (1). Whether it runs shapes the program; the value is traced (a sweep compiles once). SD: refused
    # (guidance_scale).
    true_cfg_scale: Optional[float] = None
    # Stable Diffusion: CFG rescale (diffusers' guidance_rescale, Forge's "Rescale CFG", Lin et al. 2023 for
    # v-prediction and zero-terminal-SNR models): the guided prediction cfg is replaced by rescale * cfg *
    # std(cond) / std(cfg) + (1 - rescale) * cfg, per image, on the model's output (eps or v), as diffusers'
    # rescale_noise_cfg. 0..1; null: none. A traced value: a sweep over it (0 included) compiles once.
    guidance_rescale: Optional[float] = None
    height: Optional[int] = None  # pixels, a multiple of 8 (null: the model's native size)
    width: Optional[int] = None  # pixels, a multiple of 8 (null: the model's native size)
    # The noise of DDIM and of the ancestral/SDE samplers (A1111's "Eta for DDIM" / "Eta for ancestral
    # samplers"): 0 none, 1 full. null: their defaults (DDIM 0; Euler a, DPM2 a, DPM++ 2S a, DPM++ SDE,
    # DPM++ 2M SDE, DPM++ 3M SDE 1). A sampler without noise refuses it. It shapes the program (recompiles).
    eta: Optional[float] = None
    hires: HiresConfig = field(default_factory=HiresConfig)  # A1111's Hires. fix (above)
    # With model.refiner: A1111's "Refiner switch at", diffusers' denoising_end / denoising_start -- the share of the
    # training schedule's timesteps the base denoises: a UNet call at a timestep t below round(T * (1 - switch)) (T:
    # the schedule's 1000) runs the refiner, as both switch. 0 < switch < 1. A traced input: a switch sweep compiles once.
    refiner_switch: float = 0.8


@dataclass
class ControlNetConfig:
    # A diffusers ControlNet folder (config.json + Flax .msgpack or PyTorch .safetensors weights, as
    # lllyasviel/sd-controlnet-canny ships it), or tiny-random-controlnet: the built-in one for model=tiny-random.
    model: Optional[str] = None
    # The control image (a canny map, a depth map, ...): a file, or a folder / list of files paired with
    # the prompts (prompt k gets file k; a folder's files in name order). Read as RGB in [0, 1].
    image: Any = None
    # How strongly the ControlNet's residuals steer the UNet. A traced input: a sweep over it compiles once.
    conditioning_scale: float = 1.0
    # A FLUX.1 union ControlNet's control mode: which kind of control image it is given, by the model's own numbering
    # (InstantX/FLUX.1-dev-Controlnet-Union: 0 canny, 1 tile, 2 depth, 3 blur, 4 pose, 5 gray, 6 low quality; see its
    # card). Required with a union model, refused with any other. A traced input: a sweep over it compiles once.
    control_mode: Optional[int] = None
    # Where the part of the run the ControlNet steers starts, as a fraction of its steps (diffusers'
    # control_guidance_start, A1111's "Guidance Start (T)"): step i of N reads it where start <= i / N (and the end
    # allows), else runs as without it. 0 <= start < end. A traced input: a sweep over it compiles once.
    guidance_start: float = 0.0
    # Where that part ends (diffusers' control_guidance_end, A1111's "Guidance End (T)"): step i of N reads the
    # ControlNet where (i + 1) / N <= end. start < end <= 1. A traced input.
    guidance_end: float = 1.0


@dataclass
class DistributedConfig:
    # Multi-host (one process per host, JAX's own runtime; needs parallelism=sharded). With enabled=true
    # and the three keys null, jax.distributed.initialize() detects them (TPU pods, SLURM); otherwise
    # give all three. Every process feeds only its local devices; process 0 alone writes and logs.
    enabled: bool = False
    coordinator_address: Optional[str] = None  # host:port of process 0, e.g. 10.0.0.1:1234
    num_processes: Optional[int] = None  # how many processes (hosts) take part; null: JAX detects it
    process_id: Optional[int] = None  # this process's index, 0..num_processes-1
    # How long a process waits for the others to arrive (seconds). Past it, the run stops with one
    # line naming who is missing, instead of JAX's own wait ending in a C++ abort.
    timeout_s: int = 120


@dataclass
class ParallelismConfig:
    mode: ParallelMode = ParallelMode.pmap
    num_devices: Optional[int] = None  # use the first N devices (null: all; under sharded, of every process)
    per_device_batch_size: int = 1  # images each device generates per call
    num_batches: Optional[int] = None  # calls to make (null: enough to cover the prompt list once)
    # CPU only: split the host into this many XLA devices (sets XLA_FLAGS before JAX starts), so
    # multi-device code runs on a laptop. Ignored once JAX is already initialised.
    host_device_count: Optional[int] = None
    # How the weights are placed, with parallelism=sharded: replicated (each device a whole copy) or sharded
    # (FSDP-style: each large weight split across the devices along one axis, gathered where it is used -- FLUX.1's
    # transformer block by block, everything else per component -- so a model too large for one device fits
    # across several; the same images). Shapes the program.
    params: ParamsPlacement = ParamsPlacement.replicated
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass
class TrackingConfig:
    backend: TrackingBackend = TrackingBackend.mlflow  # mlflow, or none: nothing but the run directory
    # e.g. http://127.0.0.1:5000 for a tracking server; null: MLFLOW_TRACKING_URI, else the embedded
    # store under paths.output_root (mlflow.db + mlartifacts/).
    uri: Optional[str] = None
    experiment_name: str = "sdjax-runner"  # the MLflow experiment runs are logged under
    # A tracking server that is down or flaky: each request is retried max_retries times with
    # exponential backoff (backoff_factor s, doubling) and times out after timeout_s. If it still
    # fails, the run goes on, everything is written to the run directory, status.json says
    # "logged": false, and `python -m sdjax_runner sync RUN_DIR` logs it later.
    max_retries: int = 2
    backoff_factor: int = 1  # seconds before the first retry, doubling after each (see max_retries)
    timeout_s: int = 10  # seconds one request to the tracking server may take (see max_retries)


@dataclass
class OutputConfig:
    save_images: bool = True  # write each image as a PNG under images/ (with its A1111 infotext)
    grid: bool = True  # write grid.png, every image of the run in one picture
    grid_rows: Optional[int] = None  # the grid's rows (null: as square as the image count allows)
    grid_cols: Optional[int] = None  # the grid's columns (null: from grid_rows, or as square as it allows)


@dataclass
class TimingConfig:
    # Steady-state calls wanted: timed calls after the first (which may include one-time costs). The
    # run's batches after the first count; if there are fewer, batch 0 is re-run (outputs discarded)
    # while max_extra_share allows. timings.json's steady_calls says how many the median rests on.
    repeats: int = 3
    # Bound on those re-runs: a re-run is made only while the re-runs, this one included (expected to
    # take as long as the latest call), stay within this share of what the job had cost before them
    # (its load, compile, batches and writes): 0.5 adds at most about half again. A batch that is slow
    # next to the rest of its job (90 s on a CPU) is not re-run: generate_s is then the first call's,
    # said so in timings.json (steady_calls 0) and on the console. null: no bound, exactly `repeats`
    # steady-state calls (timing.repeats=3 timing.max_extra_share=null: exact medians, as benchmarks
    # take them). 0: never a re-run.
    max_extra_share: Optional[float] = 0.5


@dataclass
class ReuseConfig:
    max_models: int = 1


@dataclass
class CompilationCacheConfig:
    enabled: bool = True
    dir: str = MISSING  # where XLA's persistent compilation cache lives (default: under paths.cache_dir)
    min_compile_time_s: float = 0.0
    # Also keep whole compiled executables (dir/executables/), so a warm start skips tracing and
    # lowering; keyed by everything that determines the program (see engine/executable_cache.py).
    # Both parallel modes, single-process runs.
    executables: bool = True
    # Bound on disk: after each job, XLA's cache entries (dir/) and the stored executables
    # (dir/executables/) together are kept under this many GB, the least recently used removed
    # first (engine/compile_cache.py: trim). null: no bound.
    max_size_gb: Optional[float] = 10.0


@dataclass
class PerformanceConfig:
    attention: Attention = Attention.default
    peak_tflops_per_device: Optional[float] = None
    gpu_memory_fraction: Optional[float] = None
    gpu_autotune_level: Optional[int] = None
    xla_flags: List[str] = field(default_factory=list)
    profile: bool = False


@dataclass
class ClipScoreConfig:
    # CLIP score of each image against its prompt (metrics/clip_score.py). On by default: with a
    # full-size model it costs well under 1% of a run's compute (docs/benchmarks.md).
    enabled: bool = True
    # A hub id (Flax weights, or PyTorch safetensors converted without torch; read from the local
    # Hugging Face cache when offline), a local CLIP directory, or where a built-in CLIP is built.
    model: str = "openai/clip-vit-large-patch14"
    builtin: Optional[str] = None  # tiny-random-clip: a random CLIP built at `model` (tests, smoke: not a judge)
    revision: Optional[str] = None  # a hub branch, tag or commit of the CLIP model


@dataclass
class PickScoreConfig:
    # PickScore (metrics/pick_score.py; Kirstain et al. 2023): a CLIP ViT-H/14 fine-tuned on people's choices between
    # images of one prompt, scoring each image for its prompt as exp(logit_scale) x cosine similarity (about 18-23 on
    # the published model; differences between settings are what it judges). Off by default: a second, ViT-H-sized
    # CLIP over every image.
    enabled: bool = False
    # transformers' CLIPModel layout (safetensors or Flax weights): a hub id in the local Hugging Face cache, or a folder
    model: str = "yuvalkirstain/PickScore_v1"
    # Where its tokenizer and image processor are: the published model has none of its own and uses LAION's CLIP-H's
    # (its README). null: the model folder's own.
    processor: Optional[str] = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
    revision: Optional[str] = None  # a hub branch, tag or commit of the model


@dataclass
class AestheticConfig:
    # The LAION aesthetic predictor (metrics/aesthetic.py): each image's predicted mean rating on AVA's 1-10 scale, from
    # its CLIP ViT-L/14 embedding. Off by default.
    enabled: bool = False
    # The predictor's weights as .safetensors (the published sac+logos+ava1-l14-linearMSE.pth converted once:
    # docs/guides/comparing.md, "Aesthetic score"; the runner reads no pickle here)
    model: Optional[str] = None
    # The CLIP it reads embeddings from (a hub id in the local cache, or a folder in transformers' layout): the
    # published predictor was trained on openai/clip-vit-large-patch14's
    clip: str = "openai/clip-vit-large-patch14"


@dataclass
class CmmdConfig:
    # CMMD (metrics/cmmd.py: google-research's estimator on CLIP image embeddings) in a sweep's comparison.json:
    # each setting's images against the baseline setting's, and against a folder of real images (reference). Off by
    # default: it embeds every image of the sweep once more, at the end, in the launching process.
    enabled: bool = False
    # A CLIP model folder in transformers' layout, or a hub id in the local Hugging Face cache. null:
    # metrics.clip_score.model's. The paper's is openai/clip-vit-large-patch14-336 (values comparable with it).
    model: Optional[str] = None
    # A folder of .png/.jpg/.jpeg images (real ones): each setting's CMMD against them too, and each run's (its
    # quality.json's cmmd). Their embeddings are kept under paths.cache_dir/cmmd/ (NumPy arrays, keyed by the files'
    # contents and the model).
    reference: Optional[str] = None


@dataclass
class MetricsConfig:
    clip_score: ClipScoreConfig = field(default_factory=ClipScoreConfig)
    pick_score: PickScoreConfig = field(default_factory=PickScoreConfig)
    aesthetic: AestheticConfig = field(default_factory=AestheticConfig)
    cmmd: CmmdConfig = field(default_factory=CmmdConfig)
    # A run directory: each image is compared (PSNR, SSIM) with that run's image of the same slot
    # (same index, seed and prompt). null: no reference.
    reference: Optional[str] = None
    # In a sweep (-m): the swept values of the reference point, e.g. {dtype: fp32, scheduler: pndm}
    # (on the command line: 'metrics.reference_point={dtype:fp32,scheduler:pndm}'). Every job is compared
    # with the job that has these values and its own values of the other swept keys (so the same seeds
    # and prompts); the reference must be one of the sweep's points. {}: none.
    reference_point: Dict[str, str] = field(default_factory=dict)


@dataclass
class ReportConfig:
    # A sweep's report.html (record/report_page.py): its X/Y grid's axes, each a swept key (its full name,
    # or a short one: steps, guidance, dtype, model, scheduler, or the last part of a dotted key). null:
    # chosen from the swept keys (x the last, y the one before it); every other swept key pages the grid (Z).
    x: Optional[str] = None
    y: Optional[str] = None  # the swept key down the grid's rows (null: the swept key before x's)
    # Of each point, which image the grid shows (its index in the run; the run's first by default).
    image: int = 0


@dataclass
class GuiderConfig:
    # How a step combines the denoiser's unconditional and conditional predictions (config/guiders.py): cfg
    # (classifier-free guidance, the default), cfg_zero_star (CFG-Zero*), apg (adaptive projected guidance), pag
    # (perturbed-attention guidance: a third prediction with guider.layers' self-attention perturbed; SD family, SD 3),
    # seg (smoothed-energy guidance: that third prediction with those layers' queries blurred; SD family, SD 3), freeu
    # (FreeU: CFG on a UNet whose up blocks reweigh their features; SD family), skip_layer (skip-layer guidance: CFG
    # plus scale * (cond - cond without the transformer blocks guider.layers) on the steps of its own window; SD 3).
    # Chosen as guider=NAME; sampling.guidance_scale is the weight each applies. The name shapes the program; the
    # settings below are traced inputs (a sweep over them compiles once). The SD family runs them all but skip_layer,
    # SD 3 all but freeu, FLUX.1 those that combine two predictions, on its true CFG (sampling.true_cfg_scale). A
    # setting its guider does not read is said once and left out.
    name: str = "cfg"
    # cfg_zero_star: the first steps whose prediction is zero (diffusers' zero_init_steps, default 1; the paper's
    # ~4% of the steps), counted among the steps that run (img2img's first is 0).
    zero_init_steps: int = 1
    # apg: the weight of the update's part parallel to the conditional prediction (diffusers' eta, default 1; at 1
    # and norm_threshold 0 the update is plain CFG's).
    eta: float = 1.0
    # apg: the largest norm of the update cond - uncond per image (diffusers' adaptive_projected_guidance_rescale,
    # default 15); 0: no cap.
    norm_threshold: float = 15.0
    # pag, seg: the weight of cond - perturbed (diffusers' pag_scale, SEG's seg_scale, default 3); skip_layer: the
    # weight of cond - cond without guider.layers (diffusers' skip_layer_guidance_scale; guider=skip_layer sets 2.8,
    # SD 3.5 Medium's card). 0 gives plain CFG's images.
    scale: float = 3.0
    # pag: the scale falls by this per timestep below 1000, down to 0 (diffusers' pag_adaptive_scale; 0: constant).
    adaptive_scale: float = 0.0
    # seg: the sigma of the Gaussian blur of the perturbed queries over the image, in latent pixels (SEG's
    # seg_blur_sigma, default 9999999); over 9999 the blur is infinite: each query its image's mean.
    blur_sigma: float = 9999999.0
    # skip_layer: the transformer blocks skipped in its extra call, by number ([7, 8, 9]: SD 3.5 Medium's card;
    # required). Static: a sweep over them compiles per value.
    # pag, seg: the self-attention layers perturbed, patterns (regular expressions) matched against the denoiser's
    # self-attention modules by their PyTorch names, as diffusers' pag_applied_layers: on a UNet [mid],
    # [down_blocks.1], [up_blocks.0.attentions.1], ...; on SD 3's transformer [blocks.1], [transformer_blocks.(4|5)],
    # ... null: the family's default, diffusers' pipelines' ([mid]; SD 3: [blocks.1]). Static: a sweep over them
    # compiles per value.
    layers: Optional[List[str]] = None
    # freeu: the first up block's backbone factor (half its features' channels). The defaults are FreeU's published
    # values for SD 1.4 and SDXL (SD 1.5: b1 1.5, b2 1.6; SD 2.1: b1 1.4, b2 1.6); all four at 1: the plain UNet.
    b1: float = 1.3
    b2: float = 1.4  # freeu: the second up block's backbone factor
    s1: float = 0.9  # freeu: the first up block's skip factor (the skip features' lowest frequencies)
    s2: float = 0.2  # freeu: the second up block's skip factor
    # skip_layer: its own window, fractions of the steps -- the extra call runs on the steps i with skip_start *
    # steps < i < skip_stop * steps (diffusers' skip_layer_guidance_start and stop, SD 3's pipeline's rule), CFG on
    # every step (the window below) -- and only where sampling.guidance_scale is over 1, as diffusers.
    skip_start: float = 0.01
    skip_stop: float = 0.2  # skip_layer: the window's end (above: skip_start)
    # Every guider: the window of steps where it guides, as fractions of the steps that run (diffusers' start and
    # stop: a step i guides where int(start * steps) <= i < int(stop * steps)); outside it the conditional
    # prediction alone, as diffusers' guiders give (the guidance interval of Kynkäänniemi et al. 2024). The window
    # shapes the program (a sweep over it compiles per value); 0 and 1: every step.
    start: float = 0.0
    stop: float = 1.0  # the window's end (above: start), a fraction of the steps that run


@dataclass
class CacheConfig:
    # A step cache (config/caches.py): none (every denoiser call runs the whole model, the default), first_block
    # (diffusers' FirstBlockCache: the first transformer block always runs; where its residual changed little
    # since the last full call, the other blocks are skipped and their residual added again), magcache (diffusers'
    # MagCache: calls skipped by the model's published magnitude ratios, the last full call's residual added) or
    # deepcache (DeepCache: a UNet's deep features reused between whole calls every cache.interval steps).
    # Chosen as cache=NAME; FLUX.1 runs the first two on its own Euler sampler, SD 3 first_block, the SD family
    # deepcache on its own scheduler (sampler=null). The name shapes the program; the settings below
    # are traced inputs (a threshold sweep compiles once). timings.json counts the calls that skipped.
    name: str = "none"
    # first_block: the largest relative mean absolute change of the first block's residual under which the other
    # blocks are skipped (diffusers' FirstBlockCacheConfig threshold, default 0.05; 0 runs every block). magcache:
    # the largest accumulated error under which a call is skipped (cache=magcache sets diffusers' 0.06).
    threshold: float = 0.05
    # magcache: the most calls skipped in a row (diffusers' MagCacheConfig max_skip_steps, the paper's K).
    max_skip_steps: int = 3
    # magcache: the share of the first steps that always run (diffusers' retention_ratio: steps before
    # int(retention_ratio * steps + 0.5) never skip).
    retention_ratio: float = 0.2
    # deepcache: the steps from one whole UNet call to the next (DeepCache's cache_interval; cache=deepcache sets
    # its README's 3; 1 runs every call whole), counted as DeepCache counts them, from the first step that runs.
    interval: int = 1
    # deepcache: which of the UNet's skip branches the calls between run, shallowest first (DeepCache's
    # cache_branch_id: level branch // 3, layer branch % 3 within it); the shallower, the less a call runs. Shapes
    # the program (a sweep over it compiles per value); at most 3 x the UNet's levels - 1.
    branch: int = 0


@dataclass
class PathsConfig:
    output_root: str = "outputs"
    cache_dir: str = MISSING


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    dtype: DtypeConfig = MISSING
    scheduler: SchedulerConfig = MISSING
    prompts: PromptsConfig = MISSING
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    reuse: ReuseConfig = field(default_factory=ReuseConfig)
    compilation_cache: CompilationCacheConfig = field(default_factory=CompilationCacheConfig)
    performance: PerformanceConfig = field(default_factory=PerformanceConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    report: ReportConfig = field(default_factory=ReportConfig)  # a sweep's report.html
    # LoRA adapters, applied together: lora='[{path: a.safetensors, scale: 0.8}]'; sweep lora.0.scale=0,0.5,1.
    lora: List[LoraConfig] = field(default_factory=list)
    # A sampler by the name A1111 or ComfyUI gives it: "DPM++ 2M Karras", "Euler a", dpmpp_2m (with
    # scheduler=karras for the sigma schedule), ... (config/samplers.py has the list). null: the diffusers
    # scheduler picked by scheduler=NAME steps, as in the Diffusers JAX guide.
    sampler: Optional[str] = None
    # How each step guides (guider=cfg, cfg_zero_star, apg; guider.* its settings): GuiderConfig above.
    guider: GuiderConfig = field(default_factory=GuiderConfig)
    # A step cache (cache=none, first_block; cache.* its settings): CacheConfig above.
    cache: CacheConfig = field(default_factory=CacheConfig)
    # Quantized weights for the denoiser (config/quantizers.py): none (as loaded, the default), int8 or fp8
    # (weight-only: one scale per output channel, the matrix multiplications' weights), int8_dynamic (int8 weights
    # and activations). Quantized once on the host, after LoRA merging and VAE swaps, and placed so: each device
    # holds the quantized copy. Another value is another program; a sweep over it loads the model once.
    quantize: str = "none"
    # What the sampler starts from and is steered by (engine/modes/): txt2img, img2img, inpaint, controlnet.
    mode: GenerationMode = GenerationMode.txt2img
    # img2img / inpaint: the starting image: a file, or a folder / list of files paired with the prompts
    # (prompt k gets file k; a folder's files in name order). Resized to height x width by resize_mode.
    init_image: Any = None
    # inpaint: the mask, white = repaint, black = keep; the init image's size. Read as A1111 reads masks: RGB by
    # its luminance, RGBA with transparency by its alpha (config/input_images.py).
    mask_image: Any = None
    # edit / inpaint on a family that reads more reference images (FLUX.2 [klein]: diffusers' Flux2KleinPipeline's
    # image list, Flux2KleinInpaintPipeline's image_reference): a file, or a folder / list of files, every one read by
    # every prompt, in order after init_image. Resized to height x width by resize_mode.
    reference_images: Any = None
    # img2img / inpaint: how much of the schedule runs, in (0, 1]: the last int(steps * strength) of the
    # steps run, from the image noised to that level (diffusers' rule). null: diffusers' defaults, 0.8 for
    # img2img, 1.0 (from pure noise) for inpaint. A traced input: a sweep over it compiles once.
    strength: Optional[float] = None
    resize_mode: ResizeMode = ResizeMode.stretch
    controlnet: ControlNetConfig = field(default_factory=ControlNetConfig)
    seed: int = 0
    run_name: str = MISSING
    experiment: Optional[str] = None


@functools.cache
def field_types(node: type) -> dict[str, Any]:
    """A schema dataclass's keys and their types, in declaration order (the type hints, which take
    milliseconds to evaluate, once per class)."""
    hints = typing.get_type_hints(node)
    return {f.name: hints[f.name] for f in dataclasses.fields(node)}


# A scalar field's type in words: the one-line errors (config/messages.py) and the reference (config/schema_docs.py).
SCALAR_WORDS: dict[Any, str] = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def without_null(kind: Any) -> tuple[Any, bool]:
    """``Optional[X]`` -> ``(X, True)``; any other type -> ``(type, False)``."""
    if typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind):
        return next(arg for arg in typing.get_args(kind) if arg is not type(None)), True
    return kind, False


def register() -> None:
    """Register the schema so ``conf/config.yaml`` can list it first in its defaults, and the
    run-naming resolvers ``hydra.run.dir`` uses."""
    from sdjax_runner.config import caches, guiders
    from sdjax_runner.config.naming import register_resolvers

    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    guiders.register(cs)
    caches.register(cs)
