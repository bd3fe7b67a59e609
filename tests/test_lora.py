"""LoRA adapters without torch: kohya and PEFT layouts, merged in JAX into the placed params with the
scale as an input -- scale 0 is no LoRA, scale 1 is the weights merged by hand, a sweep compiles once."""

import json
import os
import re

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from helpers.images import images_of
from helpers.lora_files import factors, merged_by_hand, write_kohya, write_peft

pytestmark = pytest.mark.slow

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
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "compilation_cache.executables=false", _lora(kohya), "lora.0.scale=0,1",
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


def test_odd_lora_tensors_a_replaced_file_and_non_files_are_one_line_each(tmp_path, tiny_model_dir):
    """Factors that are no matrices, rank 0, a vector alpha, no tensors, kohya and PEFT keys for one module,
    a file replaced after the plan hashed it: one line each, before anything is generated (before: tracebacks,
    or silently a no-op adapter / one of two factors). A directory or a FIFO given as the file: one line."""
    from safetensors.numpy import save_file

    from helpers.lora_files import host_params
    from sdjax_runner.errors import UserError
    from sdjax_runner.files import file_sha256
    from sdjax_runner.models import lora

    (component, path), (a, b) = next(iter(factors(tiny_model_dir).items()))
    name = ("lora_unet_" if component == "unet" else "lora_te_") + "_".join(path[:-1])
    module = f"{component} {'_'.join(path[:-1])}"
    peft = f"{component}." + ".".join(re.sub(r"_(\d+)$", r".\1", part) for part in path[:-1])  # PEFT's name
    cases = {
        "one-dimensional": ({f"{name}.lora_down.weight": a[0], f"{name}.lora_up.weight": b},
                            f"{module}: down factor is a 1-D tensor ({a.shape[1]},) (allowed: a matrix"),
        "a scalar": ({f"{name}.lora_down.weight": np.array(1.0, np.float32), f"{name}.lora_up.weight": b},
                     f"{module}: down factor is a scalar (allowed: a matrix"),
        "three-dimensional": ({f"{name}.lora_down.weight": a[None], f"{name}.lora_up.weight": b},
                              f"{module}: down factor is a 3-D tensor (1, {a.shape[0]}, {a.shape[1]})"),
        "a 3x3 convolution's down factor for a matrix": (
            {f"{name}.lora_down.weight": np.zeros((2, a.shape[1], 3, 3), np.float32), f"{name}.lora_up.weight": b},
            f"{module}: LoRA shapes {tuple(b.shape)} x (2, {9 * a.shape[1]}) do not fit its kernel"),
        "a 3x3 up factor": ({f"{name}.lora_down.weight": a, f"{name}.lora_up.weight": b[:, :, None, None] *
                             np.ones((1, 1, 3, 3), np.float32)},
                            f"{module}: up factor is a 3x3 convolution's weight"),
        "rank 0": ({f"{name}.lora_down.weight": a[:0], f"{name}.lora_up.weight": b[:, :0]},
                   f"{module}: rank 0 (down (0, {a.shape[1]})) (allowed: a rank of 1 or more)"),
        "a vector alpha": ({f"{name}.lora_down.weight": a, f"{name}.lora_up.weight": b,
                            f"{name}.alpha": np.array([1.0, 2.0], np.float32)},
                           f"{module}: alpha is 2 value(s) [1.0, 2.0] (allowed: one finite number)"),
        "kohya and PEFT keys for one module": ({f"{name}.lora_down.weight": a, f"{name}.lora_up.weight": b,
                                                f"{peft}.lora_A.weight": a, f"{peft}.lora_B.weight": b},
                                               f"weight of {module} (allowed: one key per module and factor)"),
        "no tensors": ({}, "holds no tensors"),
    }
    params = host_params(tiny_model_dir)
    for case, (tensors, expected) in cases.items():
        file = tmp_path / f"{case.replace(' ', '-')}.safetensors"
        save_file(tensors, str(file))
        with pytest.raises(UserError) as error:
            lora.read(str(file), params, "lora.0.path")
        assert expected in str(error.value), (case, str(error.value))
    good = write_kohya(tmp_path / "good.safetensors", factors(tiny_model_dir), alpha=ALPHA)
    with pytest.raises(UserError, match=r"changed since the run was planned .* not run under the old file's hash"):
        lora.read(str(good), params, "lora.0.path", expected_sha256="0" * 64)
    assert lora.read(str(good), params, "lora.0.path", file_sha256(good)).factors

    # Through the command: one line, exit 2, before any image.
    for case in ("one-dimensional", "kohya and PEFT keys for one module"):
        file = tmp_path / f"{case.replace(' ', '-')}.safetensors"
        result = run_cli("+experiment=smoke", "tracking=none", _lora(file), f"hydra.run.dir={tmp_path / case}",
                         cwd=tmp_path)
        assert_one_line_error(result, f"error: lora.0.path: {file.name}: ")
        assert cases[case][1] in result.stderr and not (tmp_path / case / "images").exists()
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    for not_a_file in (tmp_path, fifo):
        result = run_cli("+experiment=smoke", "tracking=none", _lora(not_a_file), cwd=tmp_path, timeout=60)
        assert_one_line_error(result, f"error: lora.0.path: not a regular file: {not_a_file} (allowed: a LoRA")
        result = run_cli("+experiment=smoke", "tracking=none", f"model.checkpoint={not_a_file}", cwd=tmp_path,
                         timeout=60)
        assert_one_line_error(result, f"error: model.checkpoint: not a regular file: {not_a_file} (allowed: a single")
