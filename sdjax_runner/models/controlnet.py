"""ControlNets (``controlnet.model``): a diffusers ControlNet folder -- ``config.json`` with Flax
``diffusion_flax_model.msgpack`` or PyTorch ``diffusion_pytorch_model.safetensors`` weights, as
lllyasviel/sd-controlnet-* ship them (converted without torch, as the model's components are) -- or a
built-in one (``tiny-random-controlnet``, for ``model=tiny-random``). Loaded beside the model, checked
against its UNet, and run by engine/modes/controlnet.py. FLUX.1's (``FluxControlNetModel`` folders) are loaded by
families/flux/models/controlnet.py into this module's :class:`LoadedControlNet`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.modes import CONTROLNET_ALLOWED
from sdjax_runner.console import one_line
from sdjax_runner.errors import UserError

KEY = "controlnet.model"
ALLOWED = CONTROLNET_ALLOWED
# The ControlNet's settings that must equal its UNet's: its residuals are added to the UNet's skip connections.
MATCHING = ("block_out_channels", "layers_per_block", "cross_attention_dim", "down_block_types")


@dataclass
class LoadedControlNet:
    module: Any  # FlaxControlNetModel (the SD family's), FlaxFluxControlNet (FLUX.1's)
    host_weights: Any
    path: str
    format: str  # "flax" or "safetensors"
    structure: str  # its config, as JSON: what a compiled program depends on
    load_s: float
    # performance.attention -> the module computing with it (the family's engine sets it where its modules name
    # their attention otherwise; the SD family's take ``attention``)
    for_attention: Optional[Callable[[str], Any]] = None
    modes: Optional[int] = None  # a union ControlNet's count of control modes (controlnet.control_mode); None: not one
    inpainting: bool = False  # an inpainting ControlNet (mode=controlnet_inpaint: it reads a masked image and the mask)

    def with_attention(self, attention: str) -> Any:
        """The module computing with ``performance.attention``."""
        if self.for_attention is not None:
            return self.for_attention(attention)
        return self.module.clone(attention=attention)


def folder(value: str, cache_dir: str) -> Path:
    """Where ControlNet ``value`` is (a built-in one is built there on first use)."""
    from sdjax_runner.models.builtin import BUILDS, build_builtin

    if value in BUILDS and BUILDS[value].kind == "controlnet":
        return build_builtin(value, Path(cache_dir).expanduser() / "models" / f"{value}-v1")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(KEY, f"no such directory: {path}", ALLOWED)
    return path


def read_config(path: Path, class_name: str = "ControlNetModel", what: str = "an SD ControlNet") -> dict:
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(KEY, f"{path} has no config.json", ALLOWED) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(KEY, f"{config_file} is not a JSON config ({one_line(exc, 120)})",
                        ALLOWED) from None
    name = config.get("_class_name") if isinstance(config, dict) else None
    if not isinstance(name, str) or name.removeprefix("Flax") != class_name:
        raise UserError(KEY, f"{path} holds a {name or 'config without a _class_name'}, not a {class_name} ({what}, "
                        "what this model runs)", ALLOWED)
    return config


def check_fits(config: dict, unet_config: Any, path: Path) -> None:
    """The ControlNet was made for this kind of UNet (SD 1.x or 2.x: diffusers' Flax ControlNet has no SDXL)."""
    if unet_config.get("addition_embed_type") is not None:
        raise UserError(KEY, f"{path} cannot steer an SDXL model: diffusers' Flax ControlNet is for SD 1.x/2.x",
                        "an SD 1.x or 2.x model with an SD 1.x/2.x ControlNet")
    for name in MATCHING:
        mine, theirs = config.get(name), unet_config.get(name)
        if mine is not None and theirs is not None and list(mine if isinstance(mine, (list, tuple)) else [mine]) \
                != list(theirs if isinstance(theirs, (list, tuple)) else [theirs]):
            raise UserError(KEY, f"{path} was made for another UNet ({name} {mine}, the model's {theirs})",
                            "a ControlNet trained for this model's architecture")


def load(value: str, cache_dir: str, unet_config: Any, activations, weights) -> LoadedControlNet:
    """The ControlNet, its weights as host arrays (``weights`` dtype), computing in ``activations``."""
    from sdjax_runner.models.loading import WeightChoice, load_component

    started = time.perf_counter()
    path = folder(value, cache_dir)
    config = read_config(path)
    check_fits(config, unet_config, path)
    try:
        module, params, found = load_component(path, "ControlNetModel",
                                               WeightChoice(variant=None, allow_pickle=False), activations, weights)
    except UserError as exc:  # said of the model's folder: here it is the ControlNet's
        raise UserError(KEY, exc.problem, exc.allowed or ALLOWED) from None
    except Exception as exc:  # the folder is input: whatever it holds is one line
        raise UserError(KEY, f"{path} cannot be loaded ({type(exc).__name__}: {one_line(exc)})",
                        ALLOWED) from exc
    structure = json.dumps({k: v for k, v in dict(module.config).items() if not k.startswith("_")}, sort_keys=True,
                           default=str)
    return LoadedControlNet(module, params, str(path), found.format, structure, time.perf_counter() - started)


def check_kind(loaded: LoadedControlNet, generation: str, value: str) -> None:
    """An inpainting ControlNet runs in mode=controlnet_inpaint, any other in mode=controlnet."""
    if loaded.inpainting and generation != "controlnet_inpaint":
        raise UserError("mode", f"{generation}: {value} is an inpainting ControlNet (it reads a masked image and its "
                        "mask)", "controlnet_inpaint, with init_image and mask_image")
    if not loaded.inpainting and generation == "controlnet_inpaint":
        raise UserError("controlnet.model", f"{value} is no inpainting ControlNet (its config has no "
                        "extra_conditioning_channels): it reads a control image", "an inpainting ControlNet, or "
                        "mode=controlnet with controlnet.image")


def check_mode(loaded: LoadedControlNet, control_mode: Optional[int], value: str) -> None:
    """controlnet.control_mode given for a union ControlNet (``loaded.modes`` modes), in range, and only for one."""
    if loaded.modes is None and control_mode is not None:
        raise UserError("controlnet.control_mode", f"{control_mode}: {value} is no union ControlNet (its config has no "
                        "num_mode): it reads one kind of control image", "null")
    if loaded.modes is not None and (control_mode is None or not 0 <= control_mode < loaded.modes):
        raise UserError("controlnet.control_mode", f"{control_mode}: {value} is a union ControlNet of {loaded.modes} "
                        "control modes: give the number its card gives the control image's kind",
                        f"0 to {loaded.modes - 1}")
