"""Make the PyTorch reference for DeepCache on the SD family's UNet (``cache=deepcache``, issue #62 item 2) in
``tests/fixtures/deep_cache/``.

It runs diffusers' own PyTorch ``StableDiffusionXLPipeline`` (0.39) on the tiny SDXL base of ``tests/fixtures/refiner``
(made by ``tests/helpers/make_refiner_reference.py``: diffusers' PyTorch classes, random weights, the folder's Euler
scheduler) from the runner's initial latents for seed 0 on 2 devices (that script's ``runner_noise``), STEPS steps at
32 x 32, one prompt, guidance GUIDANCE -- once plain, and once for each case of CASES with DeepCache's own helper on
it (the ``DeepCache`` package, 0.1.1: ``DeepCacheSDHelper(pipe).set_params(cache_interval, cache_branch_id)``,
``enable()``; its wheel's ``__init__`` imports the helper alone, which needs no more than torch). The helper wraps
the UNet's blocks and layers and, on the calls between whole ones, returns what they gave at the last whole call.
Each call's kind is read off the helper as it ran (a forward hook after its wrapped ``forward``): ``whole_N`` is 1
where the call ran every layer.

``deep_cache.npz``: ``latents``, ``prompt``, ``steps``, ``guidance_scale``, ``plain`` and per case ``images_N``
(float32 images in [0, 1]), ``whole_N`` and ``settings_N`` (interval, branch); ``VERSIONS.json`` the packages it
ran on (DeepCache's too). Running it twice writes identical files.

Run from the checkout's root (the reference environment of make_flux_reference.py, with DeepCache added:
``/work/refvenv/bin/pip install --no-deps DeepCache==0.1.1``)::

    /work/refvenv/bin/python tests/helpers/make_deep_cache_reference.py
    /work/refvenv/bin/python tests/helpers/make_deep_cache_reference.py --out DIR   # DIR/deep_cache
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import quiet_deterministic_torch, write_reference
from make_refiner_reference import BASE_FOLDER, runner_noise  # (it sets the offline environment)

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests" / "fixtures" / "refiner" / BASE_FOLDER
PROMPT = "a red cube on a table"
STEPS, SIZE, GUIDANCE = 8, 32, 5.0
# name -> (cache_interval, cache_branch_id): DeepCache's example (3, the shallowest branch 0); every other call
# whole; a deeper layer of the first level (1); the second level's first layer (3: block 1, layer 0); its deepest
# (5: block 1, layer 2 -- every layer of the level runs, the middle block alone is reused); and interval 1, which
# runs every call whole (the plain images)
CASES = {"i3_b0": (3, 0), "i2_b0": (2, 0), "i3_b1": (3, 1), "i2_b3": (2, 3), "i3_b5": (3, 5), "i1_b0": (1, 0)}

README = """# DeepCache reference (issue #62 item 2)

`deep_cache.npz`: diffusers' `StableDiffusionXLPipeline` (PyTorch, 0.39) on `tests/fixtures/refiner/tiny-sdxl-base`
(its Euler scheduler), {steps} steps at {size} x {size}, guidance {guidance}, the prompt `prompt`, from `latents` (the
runner's initial latents for seed 0 on 2 devices): `plain` without DeepCache, and per case `images_N` with DeepCache's
`DeepCacheSDHelper` (DeepCache 0.1.1) at `settings_N` = (cache_interval, cache_branch_id), `whole_N` the calls that
ran every layer (1) or the branch alone (0). Made by `tests/helpers/make_deep_cache_reference.py`; `VERSIONS.json`:
the packages it ran on.
"""


def sdxl_images(latents: np.ndarray, interval: int | None = None, branch: int = 0) -> tuple[np.ndarray, list[int]]:
    """The tiny SDXL's images from ``latents`` (each device's image its own call: the runner's batches are its
    devices'), with DeepCache at ``interval`` and ``branch`` (None: without), and each call's kind (1: whole), the
    first image's."""
    import torch
    from diffusers import StableDiffusionXLPipeline

    pipeline = StableDiffusionXLPipeline.from_pretrained(BASE, local_files_only=True, add_watermarker=False)
    pipeline.set_progress_bar_config(disable=True)
    images, kinds = [], []
    for latent in latents:
        helper, calls = None, []
        if interval is not None:
            from DeepCache import DeepCacheSDHelper

            helper = DeepCacheSDHelper(pipe=pipeline)
            helper.set_params(cache_interval=interval, cache_branch_id=branch)
            helper.enable()

            def after(module, args, output, helper=helper, calls=calls):
                calls.append(int((helper.cur_timestep - helper.start_timestep) % interval == 0))

            hook = pipeline.unet.register_forward_hook(after)
        with torch.no_grad():
            out = pipeline(prompt=[PROMPT], num_inference_steps=STEPS, guidance_scale=GUIDANCE, height=SIZE,
                           width=SIZE, latents=torch.from_numpy(latent[None]), output_type="np")
        images.append(np.asarray(out.images[0], dtype=np.float32))
        if helper is not None:
            hook.remove()
            helper.disable()
            kinds.append(calls)
    assert all(k == kinds[0] for k in kinds)  # every device's calls alike
    return np.stack(images), (kinds[0] if kinds else [])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    latents = runner_noise(SIZE, SIZE)
    plain, _ = sdxl_images(latents)
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS),
              "guidance_scale": np.asarray(GUIDANCE), "plain": plain}
    for case, (interval, branch) in CASES.items():
        images, whole = sdxl_images(latents, interval, branch)
        arrays[f"images_{case}"], arrays[f"whole_{case}"] = images, np.asarray(whole, dtype=np.int32)
        arrays[f"settings_{case}"] = np.asarray([interval, branch], dtype=np.int32)
        print(f"{case}: whole calls {whole}, largest difference from the plain images "
              f"{np.abs(images - plain).max():.4f}")
    folder = args.out / "deep_cache"
    write_reference(folder, "deep_cache", arrays, README.format(steps=STEPS, size=SIZE, guidance=GUIDANCE),
                    "tests/helpers/make_deep_cache_reference.py")
    versions = json.loads((folder / "VERSIONS.json").read_text())
    versions["DeepCache"] = importlib.metadata.version("DeepCache")
    (folder / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
