"""Tiny pipelines laid out as the published SD 1.5, SD 2.1 and SDXL base 1.0 repositories ship them.

``published_configs.json`` holds those repositories' own config files (model_index.json, each
component's config.json, scheduler_config.json, tokenizer and feature-extractor files), copied from
git mirrors of the hub repositories -- sources in its ``_sources``, what was not read verbatim in its
``_uncertain``. A fixture folder gets every one of those files with **every key the published file
has**, the size keys (channels, layers, vocabulary) taken from a built-in tiny model so it runs on a
CPU, and the weight files the published folder has, by their published names: PyTorch safetensors
(fp32 and the ``fp16`` variant), pickles beside them (``.bin``: never to be read), SDXL's Flax files,
ONNX/OpenVINO exports and a ``vae_1_0/`` folder the index does not name. The weights are the tiny
model's, so a fixture gives the tiny model's images wherever its scheduler config is the tiny one's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from helpers.pt_layout import pytorch_state_dict

PUBLISHED = json.loads((Path(__file__).with_name("published_configs.json")).read_text())
WEIGHTED = ("unet", "vae", "text_encoder", "text_encoder_2")
# A tiny safety checker (SD 1.5 ships one): CLIP vision tower at toy width. The Flax safety checker's
# input is fixed at 224 x 224 pixels, so the patches are large.
TINY_SAFETY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   image_size=224, patch_size=32)
TINY_SAFETY_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _sized(published: dict, tiny: dict) -> dict:
    """The published config's keys, each with the tiny model's value where the tiny config has that key."""
    return {key: tiny.get(key, value) if not key.startswith("_") else value for key, value in published.items()}


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def _save_safetensors(params: dict, library: str, path: Path, dtype) -> None:
    from safetensors.numpy import save_file

    state = {k: v.astype(dtype) for k, v in pytorch_state_dict(params, library).items()}
    save_file(state, str(path), metadata={"format": "pt"})


def write_published(tiny_dir: Path, target: Path, kind: str, index_changes: dict | None = None,
                    onnx_data_bytes: int = 2**30) -> Path:
    """``kind`` (``sd15``, ``sd21``, ``sdxl``) laid out at ``target`` with ``tiny_dir``'s weights.
    ``index_changes`` are set in model_index.json (e.g. what newer diffusers' save_pretrained writes)."""
    from flax.serialization import msgpack_restore

    files = PUBLISHED[kind]
    target.mkdir(parents=True)
    index = dict(files["model_index.json"], **(index_changes or {}))
    _write_json(target / "model_index.json", index)
    for name, config in files.items():
        if name == "model_index.json":
            continue
        folder, file_name = name.split("/")
        if file_name == "config.json" and folder in WEIGHTED:
            tiny = json.loads((tiny_dir / folder / "config.json").read_text())
            config = _sized(config, tiny)
        elif folder == "safety_checker":
            config = dict(config)
            for key in ("vision_config", "vision_config_dict"):
                config[key] = dict(config[key], **TINY_SAFETY)
            for key in ("text_config", "text_config_dict"):
                config[key] = dict(config[key], **TINY_SAFETY_TEXT)
            config["projection_dim"] = 32
        _write_json(target / name, config)
    for folder in ("tokenizer", "tokenizer_2"):
        if (target / folder).is_dir():
            for vocab in ("vocab.json", "merges.txt"):
                shutil.copy(tiny_dir / folder / vocab, target / folder / vocab)
    for folder in WEIGHTED:
        if folder not in index:
            continue
        library = index[folder][0]
        flax_name = "diffusion_flax_model.msgpack" if library == "diffusers" else "flax_model.msgpack"
        params = msgpack_restore((tiny_dir / folder / flax_name).read_bytes())
        stem = "diffusion_pytorch_model" if library == "diffusers" else "model"
        _save_safetensors(params, library, target / folder / f"{stem}.safetensors", np.float32)
        _save_safetensors(params, library, target / folder / f"{stem}.fp16.safetensors", np.float16)
        pickle = "diffusion_pytorch_model" if library == "diffusers" else "pytorch_model"
        for suffix in (".bin", ".fp16.bin"):  # published beside the safetensors; reading one would fail loudly
            (target / folder / f"{pickle}{suffix}").write_bytes(b"a pickle: never to be read")
        if kind == "sdxl":  # SDXL base ships Flax weights on main, and ONNX / OpenVINO exports
            shutil.copy(tiny_dir / folder / flax_name, target / folder / flax_name)
            (target / folder / "model.onnx").write_bytes(b"onnx graph: never read")
            (target / folder / "openvino_model.xml").write_text("<net/>")
            (target / folder / "openvino_model.bin").write_bytes(b"openvino weights: never read")
            if folder in ("unet", "text_encoder_2"):  # external ONNX weights, far over the 64 MB config bound
                with open(target / folder / "model.onnx_data", "wb") as sparse:
                    sparse.truncate(onnx_data_bytes)
    if kind == "sd15":
        shutil.copy(target / "unet" / "diffusion_pytorch_model.safetensors",
                    target / "unet" / "diffusion_pytorch_model.non_ema.safetensors")
        _write_safety_checker(target / "safety_checker")
    if kind == "sdxl":  # a folder the index does not name
        shutil.copytree(target / "vae", target / "vae_1_0", ignore=shutil.ignore_patterns("*.msgpack", "*onnx*",
                                                                                         "openvino*"))
    os.sync()
    return target


def _write_safety_checker(folder: Path) -> None:
    """Random tiny weights for SD 1.5's safety checker, under PyTorch's names."""
    import json

    import jax
    from flax.traverse_util import flatten_dict, unflatten_dict

    from sdjax_runner.families.sd.models.safety_checker import SafetyChecker

    module = SafetyChecker.from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    shapes = jax.eval_shape(module.init_weights, jax.random.PRNGKey(0))
    rng = np.random.default_rng(7)
    params = {path: 0.02 * rng.standard_normal(leaf.shape).astype(np.float32)
              for path, leaf in flatten_dict(shapes).items()}
    for thresholds in ("concept_embeds_weights", "special_care_embeds_weights"):  # at 1: no image is flagged
        params[(thresholds,)] = np.ones_like(params[(thresholds,)])
    params = unflatten_dict(params)
    for half in ("", ".fp16"):
        _save_safetensors(params, "transformers", folder / f"model{half}.safetensors",
                          np.float16 if half else np.float32)
    for suffix in (".bin", ".fp16.bin"):
        (folder / f"pytorch_model{suffix}").write_bytes(b"a pickle: never to be read")


def with_flax_weights(published: Path, tiny_dir: Path, target: Path) -> Path:
    """A copy of a published-layout folder with the tiny model's Flax weight files added beside its
    safetensors: what diffusers' own Flax ``from_pretrained`` (which cannot read PyTorch weights without
    torch) loads as the reference for that folder -- its index, configs, tokenizers and scheduler."""
    shutil.copytree(published, target)
    for flax_file in tiny_dir.glob("*/*.msgpack"):
        if (target / flax_file.parent.name).is_dir():
            shutil.copy(flax_file, target / flax_file.parent.name / flax_file.name)
    return target
