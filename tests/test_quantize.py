"""Quantized weights (issue #62, item 3; config/quantizers.py, models/quantize.py): the denoiser's weights quantized
by Qwix after LoRA merging, placed quantized, and judged against the plain run.

* the quantized weights against a NumPy transcription of Qwix 0.1.8's symmetric absmax quantization
  (``qwix/_src/core/qarray.py``: calibrate, compute_scale_zero_point, quantize_with_scale_zero_point;
  ``numerics.py``: get_symmetric_bound, convert_to), for the UNet and FLUX.1's transformer, int8 and fp8: which
  weights are quantized (every Dense kernel) and their values and scales, exactly;
* the images: a weight-only run is the float model run on its dequantized weights (made by hand in NumPy and
  written as a model folder), within an 8-bit level; LoRA is merged before quantizing (the hand-merged model
  quantized gives the same images);
* from the command line: a sweep over every quantizer on FLUX.1 with split weights loads the model once, each
  device's share of the transformer's bytes drops (int8 <= 0.4x), the records carry PSNR/SSIM against the plain
  point, the infotext names it and from_png remakes the image; a quantizer the runner does not have is one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.images import images_of
from helpers.lora_files import WEIGHT_FILES, factors, merged_by_hand, write_kohya

QUIET = ("tracking=none", "metrics.clip_score.enabled=false")


def transcribed(weight: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Qwix 0.1.8's symmetric absmax quantization of a Dense kernel (in, out) with one scale per output channel:
    ``absmax`` over the contraction axis, ``scale = absmax / bound`` in the weight's dtype (1 where below the
    square root of the smallest normal), bound ``iinfo.max + 0.5`` for int8 and ``finfo.max`` for fp8, then
    ``weight / scale`` rounded (int8: to nearest, saturated to [-128, 127]) or clipped and cast (fp8). Each
    division as XLA computes it: times the divisor's reciprocal (float32)."""
    one = np.asarray(1, weight.dtype)
    absmax = np.max(np.abs(weight), axis=0, keepdims=True)
    bound = 127.5 if qtype == "int8" else float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    scale = absmax * (one / np.asarray(bound, weight.dtype))
    scale = np.where(scale < np.sqrt(np.finfo(scale.dtype).tiny), np.ones_like(scale), scale)
    scaled = weight * (one / scale)
    if qtype == "int8":
        return np.clip(np.rint(scaled), -128, 127).astype(np.int8), scale
    return np.clip(scaled, -bound, bound).astype(ml_dtypes.float8_e4m3fn), scale


def _flat(tree: dict) -> dict:
    from flax.traverse_util import flatten_dict

    return flatten_dict(tree)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["smoke", "flux_smoke"])
@pytest.mark.parametrize("qtype", ["int8", "fp8"])
def test_every_dense_kernel_is_quantized_as_qwixs_absmax_formula_and_nothing_else(cache_dir, experiment, qtype):
    import jax

    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.engine.engine import Engine
    from sdjax_runner.engine.families import FAMILIES
    from sdjax_runner.models import quantize

    plan = make_plan(admit(compose_cfg([f"+experiment={experiment}", f"paths.cache_dir={cache_dir}"])),
                     jax.device_count())
    loaded = Engine().load(plan, "cpu").loaded
    family = FAMILIES[loaded.family]
    module = getattr(loaded.pipeline, family.denoiser)
    call = family.denoiser_call(loaded.pipeline, 1, 64, 64, 16)
    weights = loaded.host_weights[family.denoiser]
    quantized = _flat(quantize.quantized_weights(quantize.quantized_module(module, qtype), weights, call.args,
                                                 call.kwargs))
    original = _flat(weights)
    assert quantized.keys() == original.keys()
    dense = [path for path, leaf in original.items() if path[-1] == "kernel" and np.ndim(leaf) == 2]
    assert len(dense) > 10
    for path, leaf in original.items():
        if path in dense:
            expected_values, expected_scale = transcribed(np.asarray(leaf), qtype)
            stored = quantized[path].array  # a Qwix QArray inside its WithAux
            assert np.asarray(stored.qvalue).dtype == expected_values.dtype, path
            np.testing.assert_array_equal(np.asarray(stored.qvalue), expected_values, err_msg=str(path))
            np.testing.assert_array_equal(np.asarray(stored.scale), expected_scale, err_msg=str(path))
        else:  # convolutions, norms, biases, embedding tables: as loaded
            assert isinstance(quantized[path], np.ndarray), path
            np.testing.assert_array_equal(quantized[path], leaf, err_msg=str(path))


def dequantized_by_hand(model_dir: Path, target: Path, qtype: str) -> Path:
    """A copy of the tiny SD model whose UNet's Dense kernels are their quantized values times their scales (NumPy)."""
    from flax.serialization import msgpack_restore, to_bytes
    from flax.traverse_util import flatten_dict, unflatten_dict

    shutil.copytree(model_dir, target)
    file = target / "unet" / WEIGHT_FILES["unet"]
    params = flatten_dict(msgpack_restore(file.read_bytes()))
    for path, leaf in params.items():
        if path[-1] == "kernel" and np.ndim(leaf) == 2:
            values, scale = transcribed(np.asarray(leaf), qtype)
            params[path] = (values.astype(np.float32) * scale).astype(np.asarray(leaf).dtype)
    file.write_bytes(to_bytes(unflatten_dict(params)))
    return target


def off(a: list, b: list) -> tuple[int, float]:
    """The largest and the mean difference of two runs' images, in 8-bit levels."""
    differences = [np.abs(x.astype(int) - y.astype(int)) for x, y in zip(a, b, strict=True)]
    return max(int(d.max()) for d in differences), float(np.mean([d.mean() for d in differences]))


@pytest.mark.slow
def test_weight_only_int8_is_the_float_model_on_its_dequantized_weights_and_lora_is_merged_first(
        smoke_run, tmp_path, tiny_model_dir):
    _, plain_dir, _ = smoke_run  # +experiment=smoke, seed 0: the plain images
    quantized = run_cli("+experiment=smoke", *QUIET, "quantize=int8", "hydra.run.dir=int8", cwd=tmp_path)
    assert quantized.returncode == 0, quantized.stderr[-3000:]
    by_hand = dequantized_by_hand(tiny_model_dir, tmp_path / "dequantized", "int8")
    reference = run_cli("+experiment=smoke", *QUIET, "model=local", f"model.pretrained_model_name_or_path={by_hand}",
                        "hydra.run.dir=by-hand", cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    # (x @ q) * scale in the program, x @ (q * scale) by hand: the same up to float32 rounding (measured: at most 1
    # level, on 0.01% of the values); the plain images are further off (4 levels, 0.47 on average), so this tells
    # the quantized weights from the float ones
    quantized_images = images_of(tmp_path / "int8")
    worst, mean = off(quantized_images, images_of(tmp_path / "by-hand"))
    assert worst <= 1 and mean < 0.01
    worst, mean = off(quantized_images, images_of(plain_dir))
    assert worst >= 3 and mean > 0.1

    # LoRA: merged into the host weights, then quantized -- the hand-merged model, quantized, gives these images
    updates = factors(tiny_model_dir, rank=2)
    adapter = write_kohya(tmp_path / "style.safetensors", updates, alpha=1.0)
    with_lora = run_cli("+experiment=smoke", *QUIET, "quantize=int8", f"lora=[{{path: {adapter}, scale: 0.8}}]",
                        "hydra.run.dir=lora", cwd=tmp_path)
    assert with_lora.returncode == 0, with_lora.stderr[-3000:]
    assert "quantize: int8 weights of the unet in" in with_lora.stdout + with_lora.stderr
    # the adapters' UNet kernels, merged on the host before quantizing (the text encoder's on the devices, as always)
    unet_kernels = sum(1 for component, _ in updates if component == "unet")
    assert f"the LoRA adapters merged into {unet_kernels} of its layer(s) first" in with_lora.stdout + with_lora.stderr
    merged = merged_by_hand(tiny_model_dir, tmp_path / "merged-model", updates, scale=0.8, alpha=1.0)
    merged_run = run_cli("+experiment=smoke", *QUIET, "quantize=int8", "model=local",
                         f"model.pretrained_model_name_or_path={merged}", "hydra.run.dir=merged", cwd=tmp_path)
    assert merged_run.returncode == 0, merged_run.stderr[-3000:]
    assert off(images_of(tmp_path / "lora"), images_of(tmp_path / "merged"))[0] <= 1  # measured: the same images
    assert off(images_of(tmp_path / "lora"), quantized_images)[1] > 1  # the adapter acted


@pytest.fixture(scope="module")
def quantize_sweep(tmp_path_factory, cache_dir):
    """FLUX.1's smoke with its weights split over 8 devices, over every quantizer, judged against the plain point."""
    work = tmp_path_factory.mktemp("quantize")
    result = run_cli("-m", "+experiment=flux_smoke", *QUIET, f"paths.cache_dir={cache_dir}", "parallelism=sharded",
                     "parallelism.params=sharded", "compilation_cache.executables=false",
                     "quantize=none,int8,fp8,int8_dynamic", "+metrics.reference_point={quantize:none}",
                     "hydra.sweep.dir=sweep", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {json.loads((job / "images.json").read_text())[0].get("quantize", "none"): job
            for job in (work / "sweep").glob("[0-9]")}
    return work, jobs, result.stdout + result.stderr


@pytest.mark.slow
def test_a_quantize_sweep_loads_once_shrinks_each_devices_share_and_is_judged_against_the_plain_point(quantize_sweep):
    _, jobs, said = quantize_sweep
    assert sorted(jobs) == ["fp8", "int8", "int8_dynamic", "none"]
    timings = {name: json.loads((job / "timings.json").read_text()) for name, job in jobs.items()}
    assert {t["process_model_loads"] for t in timings.values()} == {1}  # one load for the sweep
    plain = timings["none"]["denoiser_param_bytes_per_device"]
    for name in ("int8", "fp8", "int8_dynamic"):
        share = timings[name]["denoiser_param_bytes_per_device"] / plain
        assert share <= 0.4, (name, share)  # 1-byte values, fp32 scales per channel, biases and norms as they were
        # the rest of the model (text encoders, VAE) as it was
        assert (timings[name]["param_bytes_per_device"] - timings[name]["denoiser_param_bytes_per_device"]
                == timings["none"]["param_bytes_per_device"] - plain)
    quality = {name: json.loads((job / "quality.json").read_text()) for name, job in jobs.items()}
    assert quality["int8"]["psnr"] > quality["fp8"]["psnr"] > 25  # e4m3 keeps 3 mantissa bits; int8 ~7
    assert all(quality[name]["psnr"] < 99 for name in ("int8", "fp8", "int8_dynamic"))  # not the plain images
    assert "psnr" not in quality["none"]  # the reference point itself
    assert "quantize int8: int8 weights, one scale per output channel (weight-only)" in said  # the plan line
    assert "quantize" not in json.loads((jobs["none"] / "images.json").read_text())[0]


@pytest.mark.slow
def test_the_infotext_names_the_quantizer_and_from_png_remakes_the_image(quantize_sweep, cache_dir):
    work, jobs, _ = quantize_sweep
    record = json.loads((jobs["int8"] / "images.json").read_text())[0]
    png = jobs["int8"] / record["file"]
    with Image.open(png) as image:
        assert ", Quantize: int8, " in image.text["parameters"]
    remade = run_cli(str(png), *QUIET, f"paths.cache_dir={cache_dir}", "parallelism=sharded",
                     "parallelism.params=sharded", "prompts.max_sequence_length=16", "hydra.run.dir=from_png",
                     command="from_png", cwd=work)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Quantize: int8 -> quantize=int8" in said
    assert json.loads((work / "from_png" / "images.json").read_text())[0]["pixels_sha256"] == record["pixels_sha256"]


def test_a_quantizer_the_runner_does_not_have_is_one_line(tmp_path):
    assert_one_line_error(call_cli("+experiment=flux_smoke", "quantize=int4", "tracking=none", cwd=tmp_path),
                          "error: quantize: int4 (allowed: none, int8, fp8, int8_dynamic)")
