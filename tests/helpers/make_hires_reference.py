"""Make the PyTorch reference for Hires. fix's latent upscalers (issue #49) in ``tests/fixtures/hires/``.

A1111's "Latent" upscalers are ``torch.nn.functional.interpolate(samples, size=(h, w), mode=..., antialias=...)``
on the first pass's latents (modules/processing.py, ``sample_hr_pass``; the modes from ``shared.latent_upscale_modes``).
The runner never imports torch: this script runs in the reference environment of
``tests/helpers/make_flux_reference.py`` (torch 2.14.1; the versions are written to ``VERSIONS.json``) and writes,
for fixed float32 latents, what PyTorch's interpolate makes of them in every mode at several sizes
(``interpolate.npz``). Running it twice writes identical files.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_hires_reference.py            # writes tests/fixtures/hires/
    /work/refvenv/bin/python tests/helpers/make_hires_reference.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np

# A1111's shared.latent_upscale_modes: its upscaler's name -> interpolate's mode and antialias
MODES = {"latent": ("bilinear", False), "latent_antialiased": ("bilinear", True),
         "latent_bicubic": ("bicubic", False), "latent_bicubic_antialiased": ("bicubic", True),
         "latent_nearest": ("nearest", False), "latent_nearest_exact": ("nearest-exact", False)}
# (in h, in w) -> (out h, out w): A1111's scales 2, 1.5, 1.25, 1 on latents of tiny and odd sizes
SIZES = [((8, 12), (16, 24)), ((8, 12), (12, 18)), ((8, 12), (10, 15)), ((5, 7), (13, 9)), ((8, 8), (8, 8))]


def main(argv: list[str]) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/hires"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for (h, w), (oh, ow) in SIZES:
        latents = np.random.default_rng(h * 100 + w).standard_normal((2, 4, h, w)).astype(np.float32)
        arrays[f"in_{h}x{w}"] = latents
        for name, (mode, antialias) in MODES.items():
            out = torch.nn.functional.interpolate(torch.from_numpy(latents), size=(oh, ow), mode=mode,
                                                  antialias=antialias)
            arrays[f"{name}_{h}x{w}_{oh}x{ow}"] = out.numpy()
    np.savez_compressed(args.out / "interpolate.npz", **arrays)
    versions = {"torch": torch.__version__, "numpy": np.__version__,
                "python": sys.version.split()[0], "script": "tests/helpers/make_hires_reference.py"}
    versions["torch_dist"] = importlib.metadata.version("torch")
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}/interpolate.npz ({len(arrays)} arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
