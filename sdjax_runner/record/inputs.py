"""What a run read besides its config (``inputs.json``), so that a re-run reads the same and a comparison
can name the input that changed: the working directory its relative paths resolved against, the
prompt list as read (a prompt file can be edited, moved or deleted afterwards), the model directory
it loaded -- with the hub commit of a hub snapshot, or each weight file's size and modification time
for a local folder (hashing gigabytes of weights per run would cost seconds) -- and the content
hashes of its LoRA adapters, single-file checkpoint, SDXL refiner and input images (img2img, inpaint, controlnet)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from sdjax_runner.config.plan import Plan

# Config keys that may hold a path relative to the working directory (and the LoRA entries' paths).
PATH_KEYS = ("model.pretrained_model_name_or_path", "model.checkpoint", "model.refiner", "metrics.reference",
             "init_image", "mask_image", "controlnet.image", "controlnet.model", "reference_images")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def collect(plan: Plan, model_path: str, components: tuple[str, ...] = ()) -> dict[str, Any]:
    """inputs.json: what the run read. ``components``: the model's components that were loaded and ran (an SD 3
    folder's text_encoder_3 is absent where it ran without T5)."""
    model_dir = Path(model_path).expanduser().resolve()
    revision = hub_revision(model_dir)
    file, built_in = plan.params.get("prompts.file", "null"), plan.params.get("prompts.set", "null")
    return {
        "cwd": os.getcwd(),
        # What the prompts are called: the prompt file's name, else the built-in set's (prompts.set), else the
        # prompts option's (prompts=NAME).
        "prompt_set": Path(file).name if file != "null" else built_in if built_in != "null"
        else plan.params.get("prompts.name", "prompts"),
        "prompts": list(plan.prompts),
        "model": {"path": str(model_dir), "revision": revision, "components": sorted(components),
                  "weights": {} if revision else weight_files(model_dir)},
        "lora": [{"path": a.path, "scale": a.scale, "sha256": a.sha256} for a in plan.lora],
        "checkpoint": {"path": plan.checkpoint.path, "sha256": plan.checkpoint.sha256} if plan.checkpoint else None,
        # SDXL's refiner: its folder and its weights' hash (config/refiner.py)
        "refiner": {"path": plan.refiner.path, "sha256": plan.refiner.sha256} if plan.refiner else None,
        # The mode's images (init_image, mask_image, controlnet.image): path and content hash of each.
        "images": [{"key": image.key, "path": image.path, "sha256": image.sha256} for image in plan.inputs.all()],
    }


def hub_revision(model_dir: Path) -> Optional[str]:
    """The commit of a Hugging Face cache snapshot (``.../snapshots/<commit>``), else None."""
    return model_dir.name if model_dir.parent.name == "snapshots" and _COMMIT.fullmatch(model_dir.name) else None


def weight_files(model_dir: Path) -> dict[str, str]:
    """``unet/diffusion_flax_model.msgpack -> "3438167536 bytes, modified 2026-11-20T09:14:03"`` for each
    weight file of a local model folder."""
    from sdjax_runner.models.checkpoints import WEIGHT_SUFFIXES

    out = {}
    for path in sorted(model_dir.glob("*/*")):
        if path.suffix in WEIGHT_SUFFIXES and path.is_file():
            stat = path.stat()
            modified = datetime.datetime.fromtimestamp(stat.st_mtime).isoformat(timespec="seconds")
            out[path.relative_to(model_dir).as_posix()] = f"{stat.st_size} bytes, modified {modified}"
    return out


def prompts_digest(prompts: list[str]) -> str:
    """12 hex digits of the SHA-256 of the prompt list: the same prompts, in the same order, the same digest."""
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()[:12]


def flat(inputs: dict[str, Any]) -> dict[str, str]:
    """The inputs that decide the pixels, one comparable string each (the prompts as their count and
    a hash of the list; where files lie is left out: a model moved to another disk is the same model)."""
    if not inputs:
        return {}
    prompts = inputs.get("prompts") or []
    out = {"prompts": f"{len(prompts)} prompt(s), sha256 {prompts_digest(prompts)}"}
    model = inputs.get("model") or {}
    if model.get("revision"):
        out["model.revision"] = model["revision"]
    out.update({f"model.weights.{name}": facts for name, facts in (model.get("weights") or {}).items()})
    for index, adapter in enumerate(inputs.get("lora") or []):
        out[f"lora.{index}.sha256"] = adapter.get("sha256")
    if inputs.get("checkpoint"):
        out["checkpoint.sha256"] = inputs["checkpoint"].get("sha256")
    if inputs.get("refiner"):
        out["refiner.sha256"] = inputs["refiner"].get("sha256")
    counts: dict[str, int] = {}
    for image in inputs.get("images") or []:  # init_image.0.sha256, mask_image.0.sha256, ...
        number = counts[image.get("key")] = counts.get(image.get("key"), -1) + 1
        out[f"{image.get('key')}.{number}.sha256"] = image.get("sha256")
    return out


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, recorded, current) for each input that differs; nothing where the record has no inputs."""
    if not recorded or not current:
        return []
    old, new = flat(recorded), flat(current)
    return [(key, old.get(key, "-"), new.get(key, "-")) for key in sorted(set(old) | set(new))
            if old.get(key, "-") != new.get(key, "-")]
