"""A1111's infotext (the ``parameters`` text its PNGs carry, and ours) -> the runner's overrides.

The text is read as A1111's ``parse_generation_parameters`` (modules/infotext_utils.py) reads it: the last
line holds the settings when it has at least three ``Key: value`` pairs (a value may be a JSON string in
double quotes, ``Size`` is ``WxH``); the lines before it are the prompt, up to a line starting with
``Negative prompt:``, and the negative prompt after it. Each setting the runner can honour becomes a
Hydra override; every other one is said in one line, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass, field

from sdjax_runner.config import caches, guiders, hires, quantizers, samplers
from sdjax_runner.config.families import DEFAULT, FAMILIES, FamilyEntry
from sdjax_runner.config.overrides import literal
from sdjax_runner.config.prompts import check_length
from sdjax_runner.config.schema import SCHEDULERS, CacheConfig, GuiderConfig
from sdjax_runner.console import shown
from sdjax_runner.errors import UserError

# A1111's own patterns (infotext_utils.py).
PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
IMAGE_SIZE = re.compile(r"([0-9]{1,6})x([0-9]{1,6})")  # ASCII digits (\d also takes "²")
# Settings that describe provenance, not how to make the image: left unsaid.
SILENT = ("Version",)
# Where an image sat in the run that made it (our infotext's): said, never honoured -- a run lays out its own
# images (its noise follows from the seed and the image's place: the same layout remakes it in the same place).
LAYOUT = ("Batch", "Device")


def packaged_options(group: str) -> list[dict]:
    """The packaged options of config group ``group`` (sdjax_runner/conf/GROUP/*.yaml), parsed, in name order."""
    from importlib import resources

    import yaml

    paths = sorted((resources.files("sdjax_runner.conf") / group).iterdir(), key=lambda p: p.name)
    return [yaml.safe_load(path.read_text(encoding="utf-8")) or {} for path in paths if path.name.endswith(".yaml")]


@functools.cache
def dtype_options() -> dict[str, str]:
    """Our infotext's Dtype is the weights' dtype: the packaged dtype option that runs it (conf/dtype/*.yaml,
    ``weights_dtype`` -> ``name``: bfloat16 -> bf16), read from the option files themselves (an option that
    leaves ``weights_dtype`` out runs the schema's default)."""
    from sdjax_runner.config.schema import DtypeConfig

    return {str(option.get("weights_dtype", DtypeConfig.weights_dtype.name)): str(option["name"])
            for option in packaged_options("dtype")}


@functools.cache
def family_models(family: str) -> frozenset[str]:
    """The packaged model options of a family (conf/model/*.yaml with ``family: NAME``): an infotext naming one is
    read as that family's (:func:`line_family`)."""
    return frozenset(str(option["name"]) for option in packaged_options("model") if option.get("family") == family)



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
    prompt: list[str] = []
    negative: list[str] = []
    in_negative = False
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


@dataclass
class Translation:
    overrides: list[str]
    honoured: list[str]  # "KEY: VALUE -> override", one per setting used
    not_honoured: list[str]  # one line each


# The numbers an infotext holds, as A1111 writes them: ASCII digits only (Python's int() and float() also take
# "²", "١٢" or "1_0", which no infotext has), so a value is a number or refused, never passed on as text.
WHOLE = re.compile(r"[0-9]{1,12}")
SIGNED = re.compile(r"-?[0-9]{1,20}")
DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,12}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})(?:[eE][+-]?[0-9]{1,3})?")


def _setting_numbers(label: str, schema: type) -> dict[str, tuple]:
    """``LABEL SETTING`` for each number field of ``schema`` (a settings group), read as its type's number."""
    return {f"{label} {f.name}": (WHOLE, int, f"a whole number, e.g. {f.default}") if f.type in (int, "int")
            else (DECIMAL, float, f"a number, e.g. {f.default}") for f in dataclasses.fields(schema)
            if f.type in (int, float, "int", "float")}


NUMBERS = {"Steps": (WHOLE, int, "a whole number, e.g. 20"), "Clip skip": (WHOLE, int, "a whole number, e.g. 2"),
           "Seed": (SIGNED, int, "a whole number, e.g. 1234"), "CFG scale": (DECIMAL, float, "a number, e.g. 7.5"),
           "Eta": (DECIMAL, float, "a number, e.g. 0.5"), "Eta DDIM": (DECIMAL, float, "a number, e.g. 0.5"),
           "Denoising strength": (DECIMAL, float, "a number, e.g. 0.75"),
           "Distilled CFG Scale": (DECIMAL, float, "a number, e.g. 3.5"),
           "SLG scale": (DECIMAL, float, "a number, e.g. 2.8"), "SLG start": (DECIMAL, float, "a number, e.g. 0.01"),
           "SLG stop": (DECIMAL, float, "a number, e.g. 0.2"), "Rescale CFG": (DECIMAL, float, "a number, e.g. 0.7"),
           "Hires upscale": (DECIMAL, float, "a number, e.g. 2"), "Hires steps": (WHOLE, int, "a whole number, e.g. 20"),
           "Hires CFG Scale": (DECIMAL, float, "a number, e.g. 5"),
           "Refiner switch at": (DECIMAL, float, "a number, e.g. 0.8"),
           # ours: a ControlNet's (record/rundir.py)
           "Control weight": (DECIMAL, float, "a number, e.g. 0.7"), "Control mode": (WHOLE, int, "a whole number, e.g. 2"),
           "Guidance Start": (DECIMAL, float, "a number, e.g. 0.1"), "Guidance End": (DECIMAL, float, "a number, e.g. 0.8"),
           # ours: a guider's and a step cache's settings, by the schema's fields (record/rundir.py: choice_parts)
           **_setting_numbers("Guider", GuiderConfig), **_setting_numbers("Step cache", CacheConfig)}


def number(key: str, text: str) -> int | float:
    """The infotext setting ``key``'s value as its number; :class:`UserError` naming the key otherwise."""
    pattern, kind, example = NUMBERS[key]
    value = text.strip()
    if pattern.fullmatch(value):
        parsed = kind(value)
        if isinstance(parsed, int) or math.isfinite(parsed):
            return parsed
    raise UserError(key, f"{text[:40]!r} is not a number the runner reads", f"{example}, in ASCII digits")


def size(text: str) -> tuple[int, int]:
    """``Size: WxH`` as (width, height); :class:`UserError` otherwise."""
    found = IMAGE_SIZE.fullmatch(text.strip())
    if not found:
        raise UserError("Size", f"{text[:40]!r} is not a size the runner reads", "WIDTHxHEIGHT in ASCII digits, e.g. 512x768")
    return int(found.group(1)), int(found.group(2))


@dataclass
class _Reading:
    """What :func:`overrides` has made of an infotext so far: the settings not read yet, the numbers among them,
    the overrides and the lines said."""

    settings: dict[str, str]
    numbers: dict[str, int | float]
    out: list[str] = field(default_factory=list)
    honoured: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def use(self, key: str, override: str) -> None:
        """Setting ``key`` read as ``override``."""
        self.out.append(override)
        self.honoured.append(f"{key}: {shown_value(self.settings.pop(key))} -> {shown_value(override)}")

    def skip(self, key: str, why: str) -> None:
        """Setting ``key`` not honoured, and why."""
        self.skipped.append(f"{key}: {shown_value(self.settings.pop(key))}: {why}")


def overrides(info: Infotext, model_options: tuple[str, ...], dtype_options: tuple[str, ...],
              has_init_image: bool, has_control_image: bool = False, has_mask_image: bool = False) -> Translation:
    """The overrides that make ``info``'s image here, as far as the runner can: ``model_options`` and
    ``dtype_options`` are the config groups' options (an infotext of ours names them). Every value reaches
    the config as a literal (:func:`sdjax_runner.config.overrides.literal`) or a number parsed here: no text
    of the infotext is read as Hydra's grammar or an interpolation. A setting the runner honours whose value
    is malformed is :class:`UserError`, before anything runs. ``has_init_image``, ``has_control_image``,
    ``has_mask_image``: the command line gives ``init_image``, ``controlnet.image``, ``mask_image`` (the images an
    infotext names but cannot hold)."""
    check_length("Prompt", info.prompt)  # before Hydra parses it (0.6 s a MB, twice)
    check_length("Negative prompt", info.negative)
    settings = dict(info.settings)
    reading = _Reading(settings, {key: number(key, settings[key]) for key in NUMBERS if key in settings})
    family = line_family(settings)
    # A guidance-distilled family (FLUX.1) runs a negative prompt only with true CFG: Forge's "CFG scale" over 1.
    true_cfg = family.true_cfg and reading.numbers.get("CFG scale", 1) > 1
    _read_prompts(info, reading, family, true_cfg)
    _read_guidance(reading, family, true_cfg and bool(info.negative))
    _read_sampling(reading)
    _read_guider(reading)
    _read_cache(reading)
    _read_choice(reading, "Quantize", "quantize", quantizers.QUANTIZERS, "a quantizer")  # ours: quantize=NAME
    if family.read_infotext is not None:
        family.read_infotext(reading)
    _read_strength(reading, has_init_image)
    _read_image_mode(reading, "Edit image", has_init_image, "edit",
                     "the edited input image (FLUX.1 Kontext's, FLUX.2's); give init_image=PATH to remake the edit")
    if "Reference images" in reading.settings:  # (their files, which a line cannot give)
        reading.skip("Reference images", "FLUX.2's more reference images; give reference_images=[PATH, ...] (in this "
                     "order) to remake the image")
    # (with an init image, and a mask, Canny/Depth's img2img and inpaint)
    controlled = "control_inpaint" if has_init_image and has_mask_image else \
        "control_img2img" if has_init_image else "control"
    _read_image_mode(reading, "Control image", has_control_image, controlled,
                     "FLUX.1 Canny/Depth's control image; give controlnet.image=PATH to remake it")
    _read_controlnet(reading, has_control_image, has_init_image and has_mask_image)
    _read_models(reading, model_options, dtype_options)
    return Translation(reading.out, reading.honoured, reading.skipped)


def line_family(settings: dict[str, str]) -> FamilyEntry:
    """The family an infotext is of: the first (in the registry's order) whose own keys it has (Forge's "Distilled
    CFG Scale": FLUX.1; ours write SD 3's Shift) or one of whose packaged models it names, else the default."""
    for entry in FAMILIES.values():
        if any(key in settings for key in entry.infotext_keys) or settings.get("Model") in family_models(entry.name):
            return entry
    return FAMILIES[DEFAULT]


def _read_prompts(info: Infotext, reading: _Reading, family: FamilyEntry, true_cfg: bool) -> None:
    """The prompt, the negative prompt (FLUX.1 reads one only with true CFG) and the syntax they are read in."""
    if info.prompt:
        reading.out += [f"prompts.texts=[{literal(info.prompt)}]", "prompts.file=null", "prompts.set=null"]
    if info.negative and family.true_cfg and not true_cfg:
        reading.skipped.append(f"Negative prompt: {shown_value(info.negative)}: {family.short} reads no negative "
                               "prompt without true CFG (a CFG scale over 1)")
    elif info.negative:
        reading.out.append(f"prompts.negative={literal(info.negative)}")
    if not family.a1111_prompts:
        reading.honoured.append(f"Prompt: read as written ({family.short} reads no A1111 emphasis)")
    else:  # An infotext's prompts are in A1111's syntax (ours escape the brackets of a plain prompt for it).
        reading.out.append("prompts.syntax=a1111")
        reading.honoured.append("Prompt: A1111's syntax -> prompts.syntax=a1111")


def _read_guidance(reading: _Reading, family: FamilyEntry, true_cfg: bool) -> None:
    """Steps, the CFG scale (FLUX.1's true CFG, or none), the distilled guidance, the seed and the size."""
    numbers = reading.numbers
    if "Steps" in numbers:
        reading.use("Steps", f"sampling.num_inference_steps={numbers['Steps']}")
    if "CFG scale" in numbers and true_cfg:
        reading.use("CFG scale", f"sampling.true_cfg_scale={numbers['CFG scale']!r}")
    elif "CFG scale" in numbers and family.true_cfg:
        reading.skip("CFG scale", f"{family.short} runs no classifier-free guidance without a negative prompt")
    elif "CFG scale" in numbers:
        reading.use("CFG scale", f"sampling.guidance_scale={numbers['CFG scale']!r}")
    if "Distilled CFG Scale" in numbers:
        reading.use("Distilled CFG Scale", f"sampling.guidance_scale={numbers['Distilled CFG Scale']!r}")
    if "Seed" in numbers:
        reading.use("Seed", f"seed={numbers['Seed']}")
        reading.honoured[-1] += (" (JAX's random numbers from it, not torch's: an A1111 image is not remade pixel "
                                 "for pixel)")
    if "Size" in reading.settings:
        width, height = size(reading.settings["Size"])
        reading.out += [f"sampling.width={width}", f"sampling.height={height}"]
        reading.honoured.append(f"Size: {reading.settings.pop('Size')} -> sampling.width={width} "
                                f"sampling.height={height}")


def _read_sampling(reading: _Reading) -> None:
    """The sampler and its schedule, eta, clip skip and Forge's CFG rescale."""
    settings, numbers = reading.settings, reading.numbers
    if "Sampler" in settings:
        reading.use("Sampler", sampler_override(settings["Sampler"], settings.pop("UniPC variant", None),
                                                reading.skipped))
    schedule = settings.get("Schedule type")
    if schedule is not None:
        ours = {v.lower(): k for k, v in samplers.A1111_SCHEDULES.items()}.get(schedule.lower())
        if ours:
            reading.use("Schedule type", f"scheduler={ours}")
        elif schedule.lower() == "automatic":
            reading.honoured.append(f"Schedule type: {settings.pop('Schedule type')} -> the sampler's default "
                                    "(normal)")
    for key in ("Eta", "Eta DDIM"):
        if key in numbers:
            reading.use(key, f"sampling.eta={numbers[key]!r}")
    if "Clip skip" in numbers:
        reading.use("Clip skip", f"prompts.clip_skip={numbers['Clip skip']}")
    if "Rescale CFG" in numbers:  # Forge's key (diffusers' guidance_rescale)
        reading.use("Rescale CFG", f"sampling.guidance_rescale={numbers['Rescale CFG']!r}")


def _read_guider(reading: _Reading) -> None:
    """Ours: ``Guider: NAME`` and the settings it read, ``Guider SETTING: VALUE`` (config/guiders.py), and a
    perturbing guider's ``Guider layers: PATTERN, ...``."""
    _read_choice(reading, "Guider", "guider", guiders.GUIDERS, "a guider", guiders.WINDOW)
    if "Guider layers" in reading.settings:
        layers = [layer.strip() for layer in reading.settings["Guider layers"].split(", ") if layer.strip()]
        reading.use("Guider layers", f"guider.layers=[{','.join(literal(layer) for layer in layers)}]")


def _read_cache(reading: _Reading) -> None:
    """Ours: ``Step cache: NAME`` and the settings it read, ``Step cache SETTING: VALUE`` (config/caches.py)."""
    _read_choice(reading, "Step cache", "cache", caches.CACHES, "a step cache")


def _read_choice(reading: _Reading, label: str, group: str, registry: dict, what: str,
                 every_entry: tuple[str, ...] = ()) -> None:
    """``LABEL: NAME`` -> ``group=NAME`` (an entry of ``registry``), and ``LABEL SETTING: VALUE`` -> ``group.SETTING``
    for the settings it reads and those of ``every_entry``."""
    if label not in reading.settings:
        return
    name = reading.settings[label].strip()
    if name not in registry:
        raise UserError(label, f"{name[:40]!r} is not {what} the runner runs", ", ".join(registry))
    reading.use(label, f"{group}={name}")
    for key in (*registry[name].reads, *every_entry):
        if f"{label} {key}" in reading.numbers:
            reading.use(f"{label} {key}", f"{group}.{key}={reading.numbers[f'{label} {key}']!r}")


def _read_strength(reading: _Reading, has_init_image: bool) -> None:
    """Hires. fix (txt2img only) and the denoising strength: img2img's, Hires. fix's second pass's, or said."""
    numbers = reading.numbers
    hires_fix = "Hires upscale" in numbers and not has_init_image
    if hires_fix:
        hires_settings(reading.settings, numbers, reading.use, reading.skipped)
    if "Denoising strength" in numbers:
        if has_init_image:
            reading.use("Denoising strength", f"strength={numbers['Denoising strength']!r}")
        elif hires_fix:
            reading.use("Denoising strength", f"sampling.hires.denoising_strength={numbers['Denoising strength']!r}")
        else:
            reading.skip("Denoising strength", "an img2img setting; give mode=img2img init_image=PATH to use it")


def _read_image_mode(reading: _Reading, key: str, has_image: bool, mode: str, without: str) -> None:
    """An image mode's ``KEY: NAME`` (ours: FLUX.1 Kontext's ``Edit image``, FLUX.1 Canny/Depth's ``Control image``):
    ``mode=MODE`` with the image given on the command line, else said (``without``: why, and what to give)."""
    if key not in reading.settings:
        return
    if has_image:
        reading.use(key, f"mode={mode}")
    else:
        reading.skip(key, without)


def _read_controlnet(reading: _Reading, has_control_image: bool, has_masked_image: bool = False) -> None:
    """Ours: ``ControlNet: PATH, Control weight: S`` (and a union model's ``Control mode: M``, and where it steers
    part of the steps ``Guidance Start: A, Guidance End: B``, A1111's ControlNet words) -- mode=controlnet with that
    ControlNet (its folder as the run had it; give ``controlnet.model=PATH`` where it is elsewhere here), its scale,
    mode and window, with the control image given on the command line -- or, given the init image and mask instead
    (``has_masked_image``), mode=controlnet_inpaint (an inpainting ControlNet's run); else said, and what to give."""
    if "ControlNet" not in reading.settings:
        return
    if not (has_control_image or has_masked_image):
        reading.skip("ControlNet", "a ControlNet run's control image is not in the PNG; give controlnet.image=PATH to "
                     "remake it (an inpainting ControlNet's: init_image=PATH mask_image=PATH)")
        return
    reading.out.append("mode=controlnet" if has_control_image else "mode=controlnet_inpaint")
    reading.use("ControlNet", f"controlnet.model={literal(reading.settings['ControlNet'])}")
    for key, setting in (("Control weight", "controlnet.conditioning_scale"), ("Control mode", "controlnet.control_mode"),
                         ("Guidance Start", "controlnet.guidance_start"), ("Guidance End", "controlnet.guidance_end")):
        if key in reading.numbers:
            reading.use(key, f"{setting}={reading.numbers[key]!r}")


def _read_models(reading: _Reading, model_options: tuple[str, ...], dtype_options: tuple[str, ...]) -> None:
    """The model and dtype where they name the runner's options; the layout, embeddings, refiner and VAE said (not
    found by name or hash here); the refiner's switch; every other setting said not honoured."""
    settings = reading.settings
    if settings.get("Model") in model_options:
        reading.use("Model", f"model={settings['Model']}")
    if "Dtype" in settings:
        dtype_setting(settings, dtype_options, reading.use, reading.skipped)
    for key in LAYOUT:
        if key in settings:
            place = shown_value(settings[key])
            reading.skip(key, f"where this image sat in the run that made it; this run lays out its images by "
                              f"parallelism.* (the same layout remakes it at {key.lower()} {place})")
    if "TI hashes" in settings:
        reading.skip("TI hashes", "embeddings are not found by hash here; give prompts.embeddings=[PATH] to use them")
    if "Refiner" in settings:  # A1111's checkpoint title "NAME [HASH]": no folder is found by it
        reading.skip("Refiner", "refiners are not found by name here; give model.refiner=PATH (a diffusers SDXL "
                                "refiner folder) to run it")
    if "Refiner switch at" in reading.numbers:  # where a given model.refiner takes over
        reading.use("Refiner switch at", f"sampling.refiner_switch={reading.numbers['Refiner switch at']!r}")
    if "VAE" in settings:
        settings.pop("VAE hash", None)
        reading.skip("VAE", "VAE files are not found by name here; give model.vae=PATH to run it")
    for key, value in settings.items():
        if key == "Model hash":
            reading.skipped.append(f"Model hash: {shown_value(value)}: models are not found by hash here; pick one "
                                   "with model=NAME")
        elif key not in SILENT:
            reading.skipped.append(f"{key}: {shown_value(value)}: not honoured")


def hires_settings(settings: dict[str, str], numbers: dict[str, float], use, skipped: list[str]) -> None:
    """A1111's Hires. fix: ``Hires upscale``, ``Hires steps`` (0: the first pass's) and ``Hires upscaler`` honoured
    (``Denoising strength`` is read with them); an upscaler that is not here (an ESRGAN model's) said, and Lanczos,
    a pixel upscaler as it is, runs in its place."""
    use("Hires upscale", f"sampling.hires.scale={numbers['Hires upscale']!r}")
    if "Hires steps" in numbers:
        use("Hires steps", f"sampling.hires.steps={numbers['Hires steps'] or 'null'}")
    if "Hires upscaler" in settings:
        name = settings["Hires upscaler"].strip()
        ours = {a1111.lower(): key for key, a1111 in hires.A1111_UPSCALERS.items()}
        ours["none"] = "lanczos"  # A1111's resize_image with no upscaler: Pillow's LANCZOS
        if name.lower() in ours:
            use("Hires upscaler", f"sampling.hires.upscaler={ours[name.lower()]}")
        else:  # the substitute is said twice: as what runs, and as what is not here
            skipped.append(f"Hires upscaler: {shown_value(name)}: not here, Lanczos runs in its place (allowed: "
                           f"{', '.join(hires.A1111_UPSCALERS.values())})")
            use("Hires upscaler", "sampling.hires.upscaler=lanczos")
    if "Hires sampler" in settings:
        hires_sampler(settings, use, skipped)
    if "Hires CFG Scale" in numbers:
        use("Hires CFG Scale", f"sampling.hires.guidance_scale={numbers['Hires CFG Scale']!r}")


def hires_sampler(settings: dict[str, str], use, skipped: list[str]) -> None:
    """A1111's ``Hires sampler`` (``Use same sampler``: none of its own) and ``Hires schedule type``: a schedule its
    name can carry (Karras, Exponential) goes with it; another is the run's own schedule, or said."""
    name = settings["Hires sampler"].strip()
    if name.lower() == "use same sampler":
        settings.pop("Hires sampler")
        return
    schedule = settings.get("Hires schedule type", "").strip()
    if schedule.lower() in ("karras", "exponential") and not name.lower().endswith(schedule.lower()):
        name = f"{name} {schedule}"
        settings.pop("Hires schedule type")
    elif schedule and schedule.lower() not in ("automatic", settings.get("Schedule type", "").strip().lower()):
        skipped.append(f"Hires schedule type: {shown_value(settings.pop('Hires schedule type'))}: the second pass "
                       "runs on the run's schedule or on one its sampler's name carries (Karras, Exponential)")
    else:
        settings.pop("Hires schedule type", None)
    try:
        samplers.resolve(name, "pndm")
    except UserError as error:
        raise UserError("Hires sampler", error.problem, error.allowed) from None
    use("Hires sampler", f"sampling.hires.sampler={literal(name)}")


def dtype_setting(settings: dict[str, str], options: tuple[str, ...], use, skipped: list[str]) -> None:
    """``Dtype``: honoured (``use``) when it names one of ``options`` (``bf16``) or the weights' dtype our
    infotext writes (``float32`` -> ``fp32``), said in ``skipped`` otherwise."""
    value = settings["Dtype"].strip()
    option = value if value in options else dtype_options().get(value.lower())
    if option in options:
        use("Dtype", f"dtype={option}")
    else:
        skipped.append(f"Dtype: {shown_value(settings.pop('Dtype'))}: no dtype option of that name, the "
                       f"run's own dtype runs (allowed: {', '.join(options) or 'none'}; give dtype=NAME)")


def sampler_override(name: str, unipc_variant: str | None = None, skipped: list[str] | None = None) -> str:
    """``Sampler: NAME`` as an override: one of ours (a diffusers scheduler by its own name) or a sampler by
    an A1111/ComfyUI name; an unknown name is :class:`UserError` here, before anything runs. A1111's UniPC
    runs the variant its ``UniPC variant`` setting names (bh1 when none is written); one not here is
    said in ``skipped`` (the default bh1 runs)."""
    skipped = [] if skipped is None else skipped
    if name in SCHEDULERS:
        return f"scheduler={name.lower()}"
    try:
        sampling = samplers.resolve(name, "pndm")
    except UserError as error:
        raise UserError("Sampler", error.problem, error.allowed) from None
    if unipc_variant is not None and sampling.sampler == "uni_pc":
        variant = samplers.UNIPC_VARIANTS.get(unipc_variant.strip().lower())
        if variant is None:
            skipped.append(f"UniPC variant: {shown_value(unipc_variant)}: not honoured, bh1 runs (allowed: "
                           f"{', '.join(samplers.UNIPC_VARIANTS)})")
        elif variant == "uni_pc_bh2":
            carried = samplers.lookup(name)[1]  # "UniPC Karras": the schedule the name carries, kept
            return f"sampler={literal('uni_pc_bh2' + (f' {carried}' if carried else ''))}"
    elif unipc_variant is not None:
        skipped.append(f"UniPC variant: {shown_value(unipc_variant)}: not honoured (a UniPC setting; Sampler: {shown_value(name)})")
    return f"sampler={literal(name)}"


def shown_value(text: str) -> str:
    """A value of the infotext as one line of the console: its control characters (line breaks too) shown
    escaped and the rest as it is, cut at 300 characters. Not :func:`sdjax_runner.console.one_line`: a value
    that is not honoured is named exactly as the file has it, its own spaces kept (``Euler  a``)."""
    return shown(text)[:300]
