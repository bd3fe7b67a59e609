"""A loaded Stable Diffusion 1.x / 2.x / XL pipeline: its modules, tokenizers and scheduler, no weights.

The weights are ``LoadedModel.host_weights`` by component (models/loading.py); every module is called with its
params passed in (``module.apply({"params": p}, ...)``), so a jitted function takes them as arguments. The
modules are the runner's own (:class:`~.unet.UNet2DConditionModel`, :class:`~sdjax_runner.models.nn.vae.
AutoencoderKL`, :class:`~sdjax_runner.models.nn.clip.CLIPTextModel`); the tokenizers are
:class:`~sdjax_runner.models.clip_tokenizer.ClipTokenizer`; the scheduler is the one the run selected
(models/schedulers.py). SDXL's pipeline (:class:`SDXLPipeline`) adds the second encoder and tokenizer and what an
empty negative prompt means; the engine tells the two apart by ``text_encoder_2`` (``hasattr``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class SDPipeline:
    """SD 1.x / 2.x (an inpainting model's too: its UNet takes 9 channels)."""

    unet: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    scheduler: Any
    dtype: Any  # the activations dtype (a jax.numpy dtype) the UNet computes in
    safety_checker: Any = None  # SD 1.x's, with model.safety_checker=true (models/safety_checker.py)
    feature_extractor: Any = None  # the safety checker's image preprocessing

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent along a side: 2 ** (the VAE's levels - 1), 8 for every published SD VAE."""
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def native_size(self) -> int:
        """The height and width the model was made for: the UNet's ``sample_size`` times the VAE's factor."""
        return int(self.unet.config.sample_size) * self.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        """Height and width must be multiples of this: the VAE's factor times the UNet's down-sampling."""
        return self.vae_scale_factor * 2 ** (len(self.unet.config.block_out_channels) - 1)

    def with_modules(self, **changes: Any) -> SDPipeline:
        """A copy with ``changes`` (module or scheduler) replaced; the modules themselves are shared."""
        return dataclasses.replace(self, **changes)

    def prepare_inputs(self, prompts: list[str]) -> np.ndarray:
        """The prompts' token ids as diffusers' Flax pipelines make them: each tokenizer's, padded to and cut at
        the first tokenizer's length (77); (batch, 77), SDXL (batch, 2, 77)."""
        rows = [tokenizer(list(prompts), padding="max_length", max_length=self.tokenizer.model_max_length,
                          truncation=True, return_tensors="np").input_ids for tokenizer in self.tokenizers]
        return rows[0] if len(rows) == 1 else np.stack(rows, axis=1)

    @property
    def tokenizers(self) -> list:
        return [self.tokenizer]

    def run_safety_checker(self, images: np.ndarray, weights: Any) -> tuple[np.ndarray, list[bool]]:
        """``images`` (N, H, W, 3) uint8 with the ones the safety checker flags made black, as diffusers' Flax
        pipeline does (``_run_safety_checker``, unjitted), and the flags. No safety checker: unchanged."""
        if self.safety_checker is None:
            return images, [False] * len(images)
        features = self.feature_extractor(images)
        flags = [bool(flag) for flag in np.asarray(self.safety_checker.apply({"params": weights}, features))]
        if any(flags):
            images = images.copy()
            images[np.asarray(flags)] = 0
            warnings.warn("Potential NSFW content was detected in one or more images. A black image will be "
                          "returned instead. Try again with a different prompt and/or seed.", stacklevel=2)
        return images, flags


@dataclass
class SDXLPipeline(SDPipeline):
    """SDXL base (and a refiner's own folder): two text encoders, the second with its projection."""

    text_encoder_2: Any = None
    tokenizer_2: Any = None
    # model_index.json's setting: no negative prompt means zero embeddings (engine/encode.py)
    force_zeros_for_empty_prompt: bool = True

    @property
    def tokenizers(self) -> list:
        return [self.tokenizer, self.tokenizer_2]
