"""LoRA adapters, torch-free: safetensors files in the common layouts, matched to the Flax params of
the UNet and text encoder(s), and merged in JAX into the placed params with the scale as a traced
input (a scale sweep loads and compiles once).

Layouts read (``A`` = down, ``B`` = up; a module's update is ``alpha / rank * B @ A`` in PyTorch's
``out x in`` layout, so ``(alpha / rank) * A.T @ B.T`` for a Flax ``in x out`` kernel):

    kohya / A1111     lora_unet_<path>.lora_down.weight, .lora_up.weight, .alpha
                      lora_te_<path> (text encoder), lora_te1_ / lora_te2_ (SDXL's two)
    PEFT / diffusers  unet.<path>.lora_A.weight, .lora_B.weight   (text_encoder., text_encoder_2.)
                      unet.<path>.lora.down.weight, .lora.up.weight (older diffusers)
    FLUX.1, SD 3      transformer.<path>.lora_A.weight, .lora_B.weight (diffusers' and PEFT's LoRAs: the
                      transformer's module paths, which the runner's FLUX.1 and SD 3 modules keep),
                      text_encoder.<path> (SD 3: text_encoder_2.<path> too)

    kohya FLUX.1      lora_unet_double_blocks_N_img_attn_qkv..., lora_unet_single_blocks_N_linear1...: Black Forest
                      Labs' module names (families/flux/models/single_file.py's table, underscored), lora_te1_ for CLIP. A
                      fused projection's update is split as its weight is: the down factor shared, the up factor's
                      rows cut into q, k, v (and a single block's MLP input), as diffusers' kohya FLUX conversion does.
    ai-toolkit FLUX.2 diffusion_model.double_blocks.N.img_attn.qkv.lora_A.weight ...: BFL's names too (families/flux2/
                      models/lora_names.py); the family's loader renames both layouts (FamilyLoader.lora_modules).

A convolution's down factor may be shaped as the convolution, ``rank x in x kh x kw`` with a 1x1 up factor (PEFT's
and kohya's LoCon for 3x3 convolutions: LCM-LoRA and Hyper-SD adapt the resnets' ``conv1`` / ``conv2`` and the
down/upsamplers so); it is read as the ``rank x (kh * kw * in)`` matrix of the Flax kernel's flattened window, so the
update merges into the ``kh x kw x in x out`` kernel as any other.

``<path>`` is the PyTorch module path (``down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q``)
or kohya's underscore spelling of it; both become the Flax path joined with underscores
(``down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q``), which is how each adapter weight
finds its kernel. A key that matches no kernel, or whose shapes do not fit it, is one line naming
how many and which module -- never silently ignored.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.errors import UserError
from sdjax_runner.files import not_a_file

# Key prefix -> pipeline component.
PREFIXES = (("lora_unet_", "unet"), ("lora_te1_", "text_encoder"), ("lora_te2_", "text_encoder_2"),
            ("lora_te_", "text_encoder"), ("unet.", "unet"), ("text_encoder_2.", "text_encoder_2"),
            ("text_encoder.", "text_encoder"), ("transformer.", "transformer"),
            ("diffusion_model.", "unet"))  # ai-toolkit's FLUX LoRAs: BFL's names, as kohya's lora_unet_ (renaming)
# The components LoRA adapts (those the loaded model has).
COMPONENTS = ("unet", "text_encoder", "text_encoder_2", "transformer")
# Key suffix -> which factor it is.
SUFFIXES = ((".lora_down.weight", "down"), (".lora_up.weight", "up"), (".lora_A.weight", "down"),
            (".lora_B.weight", "up"), (".lora.down.weight", "down"), (".lora.up.weight", "up"), (".alpha", "alpha"))


@dataclass(frozen=True)
class Adapter:
    """One LoRA file, matched to a model: per (component, Flax kernel path), the host factors
    ``down`` (in x rank, alpha / rank folded in) and ``up`` (rank x out)."""

    path: str
    sha256: str
    factors: dict  # (component, path tuple) -> (down, up)


def _split(key: str) -> Optional[tuple[str, str, str]]:
    """(component, module name with underscores, factor) of an adapter key, or None."""
    prefix, component = next(((p, c) for p, c in PREFIXES if key.startswith(p)), (None, None))
    suffix, factor = next(((s, f) for s, f in SUFFIXES if key.endswith(s)), (None, None))
    if prefix is None or component is None or suffix is None or factor is None:
        return None
    module = key[len(prefix):len(key) - len(suffix)]
    module = re.sub(r"\.processor\.(to_[a-z]+)_lora$", r".\1", module)  # older diffusers attention processors
    module = module.replace(".processor", "").replace(".", "_")
    return component, module, factor


def kernels(params: dict) -> dict[tuple[str, str], tuple]:
    """(component, module name with underscores) -> the Flax path of its kernel, for every
    Dense/Conv kernel of the components LoRA adapts."""
    from flax.traverse_util import flatten_dict

    found = {}
    for component in COMPONENTS:
        if component not in params:
            continue
        for path, leaf in flatten_dict(dict(params[component])).items():
            if path[-1] == "kernel" and getattr(leaf, "ndim", 0) in (2, 4):
                found[(component, "_".join(path[:-1]))] = path
    return found


def _numeric(dtype: np.dtype) -> bool:
    """A dtype a factor can be read in: NumPy's numbers, and ml_dtypes' bfloat16 and float8s (kind 'V')."""
    return dtype.kind in "fiu" or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _hashed_and_mapped(file: Path) -> tuple[str, Any]:
    """(the file's sha256, its bytes as a read-only memory map -- b"" for an empty file), from one open file: it is
    hashed in chunks and its tensors are views whose pages are read when a matched factor is converted -- a 1.5 GB
    file that is no adapter of this model is refused from its header, not after a 1.8 GB copy."""
    import mmap

    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
        if os.fstat(handle.fileno()).st_size == 0:
            return digest.hexdigest(), b""
        return digest.hexdigest(), mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _matrix(value: np.ndarray, what: str, name: str, config_key: str) -> np.ndarray:
    """A LoRA factor as a matrix: 2-D, a 1x1 convolution's 4-D weight, or -- a down factor of a wider
    convolution (LCM-LoRA's and PEFT's for resnets' 3x3 convolutions, kohya's LoCon) -- (rank, in, kh, kw) as
    (rank, kh * kw * in), the order of a Flax kernel's (kh, kw, in) flattened; anything else is one line."""
    if value.ndim == 2:
        return value
    if value.ndim == 4 and value.shape[2:] == (1, 1):
        return value.reshape(value.shape[:2])
    if value.ndim == 4 and what == "down":
        return value.transpose(0, 2, 3, 1).reshape(value.shape[0], -1)
    kind = (f"a {value.ndim}-D tensor {tuple(value.shape)}" if value.ndim not in (0, 4) else
            "a scalar" if value.ndim == 0 else f"a {value.shape[2]}x{value.shape[3]} convolution's weight "
                                                f"{tuple(value.shape)} (an up factor is 1x1)")
    raise UserError(config_key, f"{name}: {what} factor is {kind}",
                    "a matrix, a 1x1 convolution's weight, or a down factor shaped as its convolution")


def read(path: str, params: dict, config_key: str, expected_sha256: Optional[str] = None,
         renaming: Optional[Callable[[dict, dict, str, str], dict]] = None) -> Adapter:
    """The adapter at ``path`` matched to ``params`` (host weights); one-line errors for what does not
    fit. The file is read once and hashed from those bytes; ``expected_sha256`` (the plan's) that
    differs means it was replaced since the plan, and what was read is not run under the old hash.
    ``renaming``: the model family's (FamilyLoader.lora_modules): (modules, the transformer's params, the file's
    name, config_key) -> the modules under the transformer's own names, for a family whose LoRAs come in its
    original layout too (FLUX.1's and FLUX.2's: kohya's and ai-toolkit's Black Forest Labs names)."""
    from sdjax_runner.tensor_files import UnreadableTensors, tensors_from_bytes

    file = Path(path).expanduser()
    missing = not_a_file(file)
    if missing:
        raise UserError(config_key, f"{missing}: {file}", "a LoRA .safetensors file")
    try:  # one open file, hashed and mapped: what is hashed is what is read, and none of it copied whole
        sha256, data = _hashed_and_mapped(file)
        tensors = tensors_from_bytes(data, file.name)  # bfloat16 adapters too; views of the mapping
    except (UnreadableTensors, OSError, ValueError) as exc:
        raise UserError(config_key, f"{file} is not a readable safetensors file ({exc})") from None
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise UserError(config_key, f"{file} changed since the run was planned (sha256 {expected_sha256[:12]} -> "
                        f"{sha256[:12]}); it is not run under the old file's hash", "run again")
    if not tensors:
        raise UserError(config_key, f"{file.name} holds no tensors", "a LoRA .safetensors file")
    modules: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    keys: dict[tuple[str, str, str], str] = {}
    unknown = []
    for key, value in tensors.items():
        named = _split(key)
        if named is None:
            unknown.append(key)
            continue
        if named in keys:  # kohya and PEFT names of one module, say: which one would count?
            raise UserError(config_key, f"{file.name}: {keys[named]} and {key} are both the {named[2]} weight of "
                            f"{named[0]} {named[1]}", "one key per module and factor")
        keys[named] = key
        component, module, factor = named
        modules.setdefault((component, module), {})[factor] = value  # a view: converted once it is matched
    if unknown:
        raise UserError(config_key, f"{file.name}: {len(unknown)} key(s) in no known LoRA layout, e.g. {unknown[0]}",
                        "kohya lora_unet_/lora_te_ or PEFT/diffusers unet./text_encoder./transformer. keys")
    if renaming is not None and "transformer" in params:  # lora_unet_ / diffusion_model.: the original layout's names
        modules = renaming(modules, params["transformer"], file.name, config_key)
    targets = kernels(params)
    unmatched = sorted(m for m in modules if m not in targets)
    if unmatched:
        by_component = sorted({c for c, _ in unmatched})
        raise UserError(config_key, f"{file.name}: {len(unmatched)} module(s) match no kernel of "
                        f"{', '.join(by_component)} in this model, e.g. {unmatched[0][1]}",
                        "a LoRA made for this model's architecture")
    factors = {}
    for (component, module), parts in sorted(modules.items()):
        name = f"{file.name}: {component} {module}"
        if "down" not in parts or "up" not in parts:
            raise UserError(config_key, f"{name} lacks its {'up' if 'down' in parts else 'down'} weight")
        down, up = _matrix(parts["down"], "down", name, config_key), _matrix(parts["up"], "up", name, config_key)
        if not (_numeric(down.dtype) and _numeric(up.dtype)):
            raise UserError(config_key, f"{name}: factors of dtype {down.dtype}/{up.dtype}", "floating-point factors")
        rank = down.shape[0]
        if rank == 0:
            raise UserError(config_key, f"{name}: rank 0 (down {tuple(down.shape)})", "a rank of 1 or more")
        given = np.asarray(parts.get("alpha", np.float32(rank)), dtype=np.float64)
        if np.size(given) != 1 or not np.isfinite(given).all():
            raise UserError(config_key, f"{name}: alpha is {np.size(given)} value(s) {np.ravel(given)[:4].tolist()}",
                            "one finite number")
        alpha = float(np.ravel(given)[0])
        path_ = targets[(component, module)]
        kernel = _leaf(params[component], path_)
        # (a convolution's kernel is (kh, kw, in, out): its down factor reads kh * kw * in values)
        fan_in, fan_out = int(np.prod(kernel.shape[:-1])), kernel.shape[-1]
        window = parts["down"].shape[2:] if parts["down"].ndim == 4 else (1, 1)
        if up.shape[1] != rank or down.shape[1] != fan_in or up.shape[0] != fan_out or \
                (kernel.ndim == 4 and tuple(kernel.shape[:2]) != tuple(window)):
            raise UserError(config_key, f"{name}: LoRA shapes {tuple(up.shape)} x "
                            f"{tuple(down.shape)} do not fit its kernel {tuple(kernel.shape)}")
        factors[(component, path_)] = ((down.T.astype(np.float32) * np.float32(alpha / rank)),
                                       up.T.astype(np.float32))
    return Adapter(str(file), sha256, factors)


def _leaf(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def merge(kernel, factors: list[tuple[Any, Any]], scales):
    """``kernel + sum_i scales[i] * down_i @ up_i`` in the kernel's shape and dtype (traced: no
    recompile for another scale). Works on one device's arrays (pmap) or whole arrays (jit)."""
    import jax.numpy as jnp

    update = sum(scales[i] * jnp.matmul(down, up) for i, (down, up) in enumerate(factors))
    return (kernel.astype(jnp.float32) + update.reshape(kernel.shape)).astype(kernel.dtype)


def merged_on_host(tree: dict, component: str, adapters: list, scales: list[float]) -> tuple[dict, int]:
    """``tree`` (``component``'s host weights) with each adapter's factors for it merged at its scale, on the host's
    CPU (:func:`merge`): for weights quantized after merging (models/quantize.py). Also the kernels it changed."""
    import jax

    grouped: dict[tuple, list] = {}
    for index, adapter in enumerate(adapters):
        for (owner, path_), pair in adapter.factors.items():
            if owner == component:
                grouped.setdefault(path_, []).append((scales[index], pair))
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        for path_, entries in grouped.items():
            merged = merge(_leaf(tree, path_), [pair for _, pair in entries], [scale for scale, _ in entries])
            tree = _replaced(tree, path_, np.asarray(merged))
    return tree, len(grouped)


def merged_params(params: dict, placed_factors: dict, scales: list[float], mode: str) -> dict:
    """``params`` (placed) with every adapted kernel merged on the devices; other leaves shared.
    ``placed_factors``: (component, kernel path, adapter index) -> placed (down, up)."""
    import jax

    grouped: dict[tuple, list] = {}
    for (component, path_, index), pair in sorted(placed_factors.items(), key=lambda item: item[0][2]):
        grouped.setdefault((component, path_), []).append((index, pair))
    kernels_ = {key: _leaf(params[key[0]], key[1]) for key in grouped}
    factors = {key: [pair for _, pair in entries] for key, entries in grouped.items()}
    # The scales are arrays, not constants: another scale is another input, not another program.
    kernel_scales = {key: np.asarray([scales[index] for index, _ in entries], dtype=np.float32)
                     for key, entries in grouped.items()}
    new = (_merge_pmapped if mode == "pmap" else _merge_jitted)(kernels_, factors, kernel_scales)
    out = dict(params)
    for (component, path_), value in new.items():
        out[component] = _replaced(out[component], path_, value)
    jax.block_until_ready(out)
    return out


def _replaced(tree: Any, path: tuple, value: Any) -> Any:
    """A copy of ``tree`` along ``path`` only, with ``value`` at its end."""
    if not path:
        return value
    copy = dict(tree)
    copy[path[0]] = _replaced(tree[path[0]], path[1:], value)
    return copy


def _merge_tree(kernels_: dict, factors: dict, scales: dict):
    return {key: merge(kernels_[key], factors[key], scales[key]) for key in kernels_}


@functools.cache
def _merge_program(pmapped: bool) -> Any:
    """The merge as one program, made once per process: jitted, or pmapped over placed (device-axis) weights."""
    import jax

    return jax.pmap(_merge_tree, in_axes=(0, 0, None)) if pmapped else jax.jit(_merge_tree)


def _merge_jitted(kernels_, factors, scales):
    return _merge_program(False)(kernels_, factors, scales)


def _merge_pmapped(kernels_, factors, scales):
    return _merge_program(True)(kernels_, factors, scales)
