"""SDXL's refiner (``model.refiner``; config/refiner.py): its UNet and second text encoder, read from a diffusers folder
of stabilityai/stable-diffusion-xl-refiner-1.0's layout (Flax weights, or PyTorch safetensors converted without
torch, as the model's components are), checked against the base it takes over from, and held beside it
(engine/reuse.py) for engine/refiner.py to run."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdjax_runner.config.refiner import ALLOWED, KEY, Refiner, weights_sha256
from sdjax_runner.console import one_line
from sdjax_runner.errors import UserError


@dataclass
class LoadedRefiner:
    unet: Any  # FlaxUNet2DConditionModel
    text_encoder_2: Any  # FlaxCLIPTextModelWithProjection
    host_weights: dict  # {"unet": ..., "text_encoder_2": ...}
    path: str
    structure: str  # its modules' configs, as JSON: what a compiled program depends on
    load_s: float


def load(refiner: Refiner, base: Any, activations, weights) -> LoadedRefiner:
    """The refiner of the plan, its weights as host arrays (``weights`` dtype) computing in ``activations``; ``base``:
    the loaded model's pipeline, which it must fit."""
    from sdjax_runner.models.loading import WeightChoice, load_component

    started = time.perf_counter()
    path = Path(refiner.path)
    if not hasattr(base, "text_encoder_2"):
        raise UserError(KEY, "a refiner takes over from an SDXL base; this run's model has one text encoder "
                        "(SD 1.x/2.x)", "null, or an SDXL base model")
    now = weights_sha256(path)
    if now != refiner.sha256:
        raise UserError(KEY, f"{path}'s weights changed since the run was planned (sha256 {refiner.sha256[:12]} -> "
                        f"{now[:12]}); it is not run under the old weights' hash", "run again")
    same_tokenizer(path, base.tokenizer_2)
    choice = WeightChoice(variant=None, allow_pickle=False)
    modules, params = {}, {}
    for name, class_name in (("unet", "UNet2DConditionModel"), ("text_encoder_2", "CLIPTextModelWithProjection")):
        try:
            modules[name], params[name], _ = load_component(path / name, class_name, choice, activations, weights)
        except UserError as exc:  # said of the model's folder: here it is the refiner's
            raise UserError(KEY, exc.problem, exc.allowed or ALLOWED) from None
        except Exception as exc:  # the folder is input: whatever it holds is one line
            raise UserError(KEY, f"{path}/{name} cannot be loaded ({type(exc).__name__}: {one_line(exc)})",
                            ALLOWED) from exc
    check_fits(modules["unet"].config, modules["text_encoder_2"].config, base, refiner.aesthetic, path)
    structure = json.dumps([dict(module.config) for module in modules.values()], sort_keys=True, default=str)
    return LoadedRefiner(modules["unet"], modules["text_encoder_2"], params, str(path), structure,
                         time.perf_counter() - started)


def same_tokenizer(path: Path, base_tokenizer: Any) -> None:
    """The refiner reads the base's second tokenizer's ids (one prompt encoding per image): its own must be the same
    tokenizer -- vocabulary, merges and padding token -- as the published refiner's is SDXL base's."""
    from sdjax_runner.models.clip_tokenizer import ClipTokenizer

    try:
        own = ClipTokenizer.from_folder(path / "tokenizer_2")
    except Exception as exc:
        raise UserError(KEY, f"{path}/tokenizer_2 cannot be read ({type(exc).__name__}: {one_line(exc)})",
                        ALLOWED) from exc
    if (own.get_vocab() != base_tokenizer.get_vocab() or own.bpe_ranks != base_tokenizer.bpe_ranks
            or own.pad_token != base_tokenizer.pad_token):
        raise UserError(KEY, f"{path}/tokenizer_2 is not the base model's second tokenizer (vocabulary, merges or "
                        "padding token differ)", "a refiner made for this base (SDXL's refiner shares its tokenizer)")


def check_fits(unet: Any, text_encoder: Any, base: Any, aesthetic: bool, path: Path) -> None:
    """The refiner's UNet reads what it is given: its second text encoder's penultimate states (its cross-attention
    width), that encoder's pooled projection and 5 size/aesthetic time ids (6 size ids without aesthetic scores),
    and latents with the base's channels."""
    ids = 5 if aesthetic else 6
    expected = {
        "addition_embed_type": "text_time",
        "cross_attention_dim": text_encoder.hidden_size,
        "projection_class_embeddings_input_dim": text_encoder.projection_dim
        + ids * (unet.get("addition_time_embed_dim") or 0),
        "in_channels": base.unet.config.in_channels,
        "out_channels": base.unet.config.out_channels,
    }
    for name, wanted in expected.items():
        got = unet.get(name)
        got = got[0] if isinstance(got, (list, tuple)) and len(set(got)) == 1 else got
        if got != wanted:
            raise UserError(KEY, f"{path}/unet/config.json has {name} {got}, but the refiner is given {wanted} "
                            f"({'its text encoder 2' if 'dim' in name else 'the base'}'s; "
                            f"requires_aesthetics_score {aesthetic})", "an SDXL refiner made for this base")
