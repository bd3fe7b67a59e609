"""LoRA adapters without torch: kohya and PEFT layouts, merged in JAX into the placed params with the
scale as an input -- scale 0 is no LoRA, scale 1 is the weights merged by hand, a sweep compiles once."""

import json
import os

import numpy as np

from helpers.cli import assert_one_line_error, run_cli
from helpers.images import images_of
from helpers.lora_files import factors, merged_by_hand, write_kohya, write_peft

RANK, ALPHA = 2, 1.0


def _lora(path, scale=1.0):
    return f"lora=[{{path: {path}, scale: {scale}}}]"


def test_scale_zero_is_no_lora_scale_one_is_the_hand_merged_model_and_a_sweep_compiles_once(
        smoke_run, tmp_path, tiny_model_dir):
    _, plain_dir, _ = smoke_run  # +experiment=smoke, no LoRA, seed 0
    updates = factors(tiny_model_dir, rank=RANK)
    kohya = write_kohya(tmp_path / "style.safetensors", updates, alpha=ALPHA)
    sweep = tmp_path / "sweep"
    # Stored executables off: this counts what the process itself compiles (test_warm_start covers them).
    result = run_cli("-m", "+experiment=smoke", "tracking=none", _lora(kohya), "lora.0.scale=0,1",
                     "compilation_cache.executables=false", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    timings = [json.loads((sweep / job / "timings.json").read_text()) for job in ("0", "1")]
    assert [t["process_compiles"] for t in timings] == [1, 1]  # the scale is an input: one program
    assert [t["process_model_loads"] for t in timings] == [1, 1]

    plain, zero, one = images_of(plain_dir), images_of(sweep / "0"), images_of(sweep / "1")
    assert all(np.array_equal(a, b) for a, b in zip(plain, zero, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(plain, one, strict=True))

    # The reference: the same update merged into a copy of the model in NumPy, run as model=local.
    by_hand = merged_by_hand(tiny_model_dir, tmp_path / "merged", updates, scale=1.0, alpha=ALPHA)
    result = run_cli("+experiment=smoke", "tracking=none", "model=local", f"model.pretrained_model_name_or_path={by_hand}",
                     f"hydra.run.dir={tmp_path / 'by-hand'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for a, b in zip(one, images_of(tmp_path / "by-hand"), strict=True):  # float32 rounding of the merge only
        difference = np.abs(a.astype(int) - b.astype(int))
        assert difference.max() <= 2 and difference.mean() < 0.01

    # The records name the adapter, its scale and its content hash.
    record = json.loads((sweep / "1" / "images.json").read_text())[0]
    assert record["lora"].startswith("style.safetensors:1:sha256=") and len(record["lora"].split("=")[1]) == 12


def test_peft_layout_gives_the_kohya_images(tmp_path, tiny_model_dir):
    updates = factors(tiny_model_dir, rank=RANK)
    kohya = write_kohya(tmp_path / "kohya.safetensors", updates, alpha=float(RANK))  # alpha = rank, as PEFT's default
    peft = write_peft(tmp_path / "peft.safetensors", updates)
    runs = {}
    for name, path in (("kohya", kohya), ("peft", peft)):
        result = run_cli("+experiment=smoke", "tracking=none", _lora(path, 0.7), f"hydra.run.dir={tmp_path / name}",
                         cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        runs[name] = images_of(tmp_path / name)
    assert all(np.array_equal(a, b) for a, b in zip(runs["kohya"], runs["peft"], strict=True))


def test_keys_that_match_no_module_are_one_line_not_ignored(tmp_path, tiny_model_dir):
    stray = {"lora_unet_down_blocks_9_attentions_0_proj_in.lora_down.weight": np.zeros((2, 32), np.float32),
             "lora_unet_down_blocks_9_attentions_0_proj_in.lora_up.weight": np.zeros((32, 2), np.float32)}
    path = write_kohya(tmp_path / "other-model.safetensors", {}, alpha=ALPHA, extra=stray)
    result = run_cli("+experiment=smoke", "tracking=none", _lora(path), cwd=tmp_path)
    assert_one_line_error(result, "error: lora.0.path: other-model.safetensors: 1 module(s) match no kernel of unet "
                                  "in this model, e.g. down_blocks_9_attentions_0_proj_in (allowed: a LoRA made for "
                                  "this model's architecture)")
    result = run_cli("+experiment=smoke", "tracking=none", _lora(tmp_path / "missing.safetensors"), cwd=tmp_path)
    assert_one_line_error(result, f"error: lora.0.path: no such file: {tmp_path / 'missing.safetensors'}")
    # A file that is no adapter is refused from its header, before the run hashes every byte of it
    # (a terabyte: the timeout fails the test if it is read): a sparse file of nothing, and a real
    # adapter with zeros behind its data.
    garbage = tmp_path / "garbage.safetensors"
    with open(garbage, "wb") as file:
        file.truncate(2**40)
    padded = write_kohya(tmp_path / "padded.safetensors", {}, alpha=ALPHA, extra=stray)
    os.truncate(padded, 2**40)
    for bad, why in ((garbage, "invalid JSON in header"), (padded, "incomplete metadata, file not fully covered")):
        result = run_cli("+experiment=smoke", "tracking=none", _lora(bad), cwd=tmp_path, timeout=120)
        assert_one_line_error(result, f"error: lora.0.path: {bad} is not a readable safetensors file (")
        assert why in result.stderr
