"""Make the PyTorch reference for FLUX.1 Kontext's editing (``mode=edit``, issue #63 item 2) in
``tests/fixtures/kontext/``.

FLUX.1 Kontext [dev] is FLUX.1 [dev]'s architecture; its pipeline (diffusers' ``FluxKontextPipeline``) encodes the
input image (the VAE posterior's mode, ``(latents - shift_factor) * scaling_factor``), packs it into tokens placed
after the noise's in every transformer call, their position ids' first coordinate 1 (the noise's 0), and keeps the
prediction for the noise's tokens.

The model, ``tiny-flux-kontext/`` (written here with ``save_pretrained``, its index naming FluxKontextPipeline): the
published tiny FLUX.1 [dev] folder (``tests/fixtures/flux/tiny-flux-dev``, make_flux_reference.py) with two groups of
its random weights scaled so that an input image moves the images measurably -- in that folder a block's
contribution is small beside the residual stream and the encoder's latents small beside the noise, and the input
image moved the images by 2 8-bit levels: the transformer's modulation (``norm1``, ``norm1_context``, ``norm``), value
and output projections by TRANSFORMER_SCALE, the VAE encoder's last convolution by ENCODER_SCALE. (The decoder, the
text encoders and everything else are the folder's.)

The pipeline runs on it with a fixed 32x32 input image (make_flow_image_modes_reference's ``init_image``, written
here as ``init.png``), from the runner's noise for seed 0 (one image on each of 2 devices:
make_flux_reference.runner_noise, packed as FluxPipeline packs), 4 steps, at each guidance of GUIDANCES, at the fixed
resolution (``max_area`` the image's own, no auto-resize: the pipeline otherwise picks one of its preferred
resolutions); with the input image's colours inverted at the first guidance (``inverted``); and FluxPipeline's
images without an input image (``txt2img``).

``kontext.npz``: ``images_G`` (device, H, W, 3) in [0, 1] per guidance G, ``inverted``, ``txt2img`` and the
settings; ``VERSIONS.json`` the packages. Running it again writes identical files.

Run from the checkout's root (the reference environment of make_flux_reference.py)::

    /work/refvenv/bin/python tests/helpers/make_kontext_reference.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flow_image_modes_reference import init_image
from make_flux_reference import (
    HEIGHT,
    MAX_SEQUENCE_LENGTH,
    NUM_DEVICES,
    PROMPT,
    SEED,
    WIDTH,
    _save_npz,
    _versions,
    load_aligned,
    quiet_deterministic_torch,
    runner_noise,
)

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "fixtures" / "flux" / "tiny-flux-dev"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "kontext"
STEPS = 4
GUIDANCES = (2.5, 6.0)  # FluxKontextPipeline's default 3.5 aside: a guidance sweep in the test
TRANSFORMER_SCALE, ENCODER_SCALE = 6.0, 10.0
SCALED = (".norm1.linear.", ".norm1_context.linear.", ".norm.linear.", ".to_v.", ".to_out.", ".add_v_proj.",
          ".to_add_out.")


def build(out: Path) -> Path:
    """``tiny-flux-kontext/`` at ``out``: tiny-flux-dev as FluxKontextPipeline with the weights scaled (module
    docstring)."""
    import torch

    pipeline = load_aligned("FluxKontextPipeline", FOLDER)
    with torch.no_grad():
        for name, parameter in pipeline.transformer.named_parameters():
            if any(part in f".{name}" for part in SCALED):
                parameter.mul_(TRANSFORMER_SCALE)
        for parameter in pipeline.vae.encoder.conv_out.parameters():
            parameter.mul_(ENCODER_SCALE)
    pipeline.save_pretrained(out, safe_serialization=True)
    return out


def _call(pipeline, noise: np.ndarray, guidance: float, picture=None) -> np.ndarray:
    """One image from one device's noise (unpacked NCHW), with ``picture`` as Kontext's input image or none."""
    import torch
    from PIL import Image

    batch, channels, h, w = noise.shape
    packed = pipeline._pack_latents(torch.from_numpy(noise), batch, channels, h, w)
    edit = {} if picture is None else {"image": Image.fromarray(picture), "max_area": HEIGHT * WIDTH,
                                       "_auto_resize": False}
    with torch.no_grad():
        images = pipeline(prompt=[PROMPT], height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                          guidance_scale=guidance, max_sequence_length=MAX_SEQUENCE_LENGTH, latents=packed,
                          output_type="np", **edit).images
    return np.asarray(images[0], dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    from PIL import Image

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the fixture folder")
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    args.out.mkdir(parents=True, exist_ok=True)
    picture = init_image()
    noise = runner_noise()
    folder = build(args.out / "tiny-flux-kontext")
    kontext = load_aligned("FluxKontextPipeline", folder)
    out: dict[str, np.ndarray] = {
        "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS, dtype=np.int64),
        "guidances": np.asarray(GUIDANCES, dtype=np.float64), "height": np.asarray(HEIGHT, dtype=np.int64),
        "width": np.asarray(WIDTH, dtype=np.int64), "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH, np.int64),
        "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64)}
    for guidance in GUIDANCES:
        out[f"images_{guidance:g}"] = np.stack([_call(kontext, noise[i:i + 1], guidance, picture)
                                                for i in range(NUM_DEVICES)])
    out["inverted"] = np.stack([_call(kontext, noise[i:i + 1], GUIDANCES[0], 255 - picture)
                                for i in range(NUM_DEVICES)])
    plain = load_aligned("FluxPipeline", folder)
    out["txt2img"] = np.stack([_call(plain, noise[i:i + 1], GUIDANCES[0]) for i in range(NUM_DEVICES)])
    first = out[f"images_{GUIDANCES[0]:g}"]
    print(f"largest difference from the images without the input image {np.abs(first - out['txt2img']).max():.4f}, "
          f"with it inverted {np.abs(first - out['inverted']).max():.4f}, between the guidances "
          f"{np.abs(first - out[f'images_{GUIDANCES[1]:g}']).max():.4f}")
    _save_npz(args.out / "kontext.npz", out)
    Image.fromarray(picture).save(args.out / "init.png")
    (args.out / "VERSIONS.json").write_text(json.dumps(_versions(), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
