"""A1111's infotext (the ``parameters`` text its PNGs carry, and ours) -> the runner's overrides.

The text is read as A1111's ``parse_generation_parameters`` (modules/infotext_utils.py) reads it: the last
line holds the settings when it has at least three ``Key: value`` pairs (a value may be a JSON string in
double quotes, ``Size`` is ``WxH``); the lines before it are the prompt, up to a line starting with
``Negative prompt:``, and the negative prompt after it. Each setting the runner can honour becomes a
Hydra override; every other one is said in one line, never silently dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from sdjax_runner.config import samplers
from sdjax_runner.config.schema import SCHEDULERS

# A1111's own patterns (infotext_utils.py).
PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
IMAGE_SIZE = re.compile(r"^(\d+)x(\d+)$")
# Settings that describe the run's layout or provenance here, not how to make the image.
SILENT = ("Batch", "Device", "Version", "Dtype")


@dataclass
class Infotext:
    prompt: str
    negative: str
    settings: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> Infotext:
    """A1111's reading of an infotext (see the module docstring)."""
    *lines, last = text.strip().split("\n")
    if len(PARAM.findall(last)) < 3:
        lines.append(last)
        last = ""
    prompt, negative, in_negative = [], [], False
    for line in lines:
        line = line.strip()
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line[len("Negative prompt:"):].strip()
        (negative if in_negative else prompt).append(line)
    settings = {}
    for key, value in PARAM.findall(last):
        if len(value) > 1 and value[0] == '"' and value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                pass
        settings[key] = value
    return Infotext("\n".join(prompt), "\n".join(negative), settings)


def hydra_quoted(text: str) -> str:
    """``text`` as a single-quoted Hydra value that composes back to exactly ``text``: quotes escaped, the
    backslashes before a quote (or the closing one) doubled, ``${`` kept from being an interpolation."""
    out = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    out = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, out)
    return "'" + out.replace("${", "\\${") + "'"


@dataclass
class Translation:
    overrides: list[str]
    honoured: list[str]  # "KEY: VALUE -> override", one per setting used
    not_honoured: list[str]  # one line each


def overrides(info: Infotext, model_options: tuple[str, ...], dtype_options: tuple[str, ...],
              has_init_image: bool) -> Translation:
    """The overrides that make ``info``'s image here, as far as the runner can: ``model_options`` and
    ``dtype_options`` are the config groups' options (an infotext of ours names them)."""
    out: list[str] = []
    honoured: list[str] = []
    skipped: list[str] = []
    settings = dict(info.settings)

    def use(key: str, override: str) -> None:
        out.append(override)
        honoured.append(f"{key}: {settings.pop(key)} -> {override}")

    if info.prompt:
        out.append(f"prompts.texts=[{hydra_quoted(info.prompt)}]")
        out.append("prompts.file=null")
    if info.negative:
        out.append(f"prompts.negative={hydra_quoted(info.negative)}")
    # An infotext's prompts are in A1111's syntax (ours escape the brackets of a plain prompt for it).
    out.append("prompts.syntax=a1111")
    honoured.append("Prompt: A1111's syntax -> prompts.syntax=a1111")
    if settings.get("Steps", "").isdigit():
        use("Steps", f"sampling.num_inference_steps={settings['Steps']}")
    if "CFG scale" in settings and _number(settings["CFG scale"]) is not None:
        use("CFG scale", f"sampling.guidance_scale={settings['CFG scale']}")
    if settings.get("Seed", "").lstrip("-").isdigit():
        use("Seed", f"seed={settings['Seed']}")
        honoured[-1] += " (JAX's random numbers from it, not torch's: an A1111 image is not remade pixel for pixel)"
    size = IMAGE_SIZE.match(settings.get("Size", ""))
    if size:
        width, height = size.groups()
        out.extend([f"sampling.width={width}", f"sampling.height={height}"])
        honoured.append(f"Size: {settings.pop('Size')} -> sampling.width={width} sampling.height={height}")
    if "Sampler" in settings:
        name = settings["Sampler"]
        if name in SCHEDULERS:
            use("Sampler", f"scheduler={name.lower()}")  # one of ours: a diffusers scheduler by its own name
        else:
            use("Sampler", f"sampler={hydra_quoted(name)}")
    schedule = settings.get("Schedule type")
    if schedule is not None:
        ours = {v.lower(): k for k, v in samplers.A1111_SCHEDULES.items()}.get(schedule.lower())
        if ours:
            use("Schedule type", f"scheduler={ours}")
        elif schedule.lower() == "automatic":
            honoured.append(f"Schedule type: {settings.pop('Schedule type')} -> the sampler's default (normal)")
    for key in ("Eta", "Eta DDIM"):
        if key in settings and _number(settings[key]) is not None:
            use(key, f"sampling.eta={settings[key]}")
    if settings.get("Clip skip", "").isdigit():
        use("Clip skip", f"prompts.clip_skip={settings['Clip skip']}")
    if "Denoising strength" in settings:
        if has_init_image:
            use("Denoising strength", f"strength={settings['Denoising strength']}")
        else:
            skipped.append(f"Denoising strength: {settings.pop('Denoising strength')}: an img2img setting; give "
                           "mode=img2img init_image=PATH to use it")
    if settings.get("Model") in model_options:
        use("Model", f"model={settings['Model']}")
    if settings.get("Dtype") in dtype_options:
        use("Dtype", f"dtype={settings['Dtype']}")
    for key, value in settings.items():
        if key == "Model hash":
            skipped.append(f"Model hash: {value}: models are not found by hash here; pick one with model=NAME")
        elif key not in SILENT:
            skipped.append(f"{key}: {value}: not honoured")
    return Translation(out, honoured, skipped)


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None
