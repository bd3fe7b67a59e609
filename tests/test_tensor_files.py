"""safetensors files read with NumPy alone, bfloat16 included (sdjax_runner/tensor_files.py): what the
safetensors library's own NumPy reader gives for the dtypes it knows, and bfloat16 weights, LoRAs and
components -- the dtype most published checkpoints and fine-tunes are in -- loaded as the float32 ones are."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from helpers import lora_files
from sdjax_runner.tensor_files import UnreadableTensors, read_safetensors, tensors_from_bytes

BF16 = np.dtype(ml_dtypes.bfloat16)


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5)).astype(np.float32)
    return {"f32": values, "f16": values.astype(np.float16), "bf16": values.astype(BF16),
            "i64": np.arange(6, dtype=np.int64).reshape(2, 3), "scalar": np.array(0.5, np.float32),
            "empty": np.zeros((0, 4), np.float32), "flag": np.array([True, False])}


def test_every_dtype_reads_as_safetensors_wrote_it(tmp_path):
    written = _tensors()
    save_file(written, str(tmp_path / "t.safetensors"), metadata={"format": "pt"})
    for read in (read_safetensors(tmp_path / "t.safetensors"),
                 tensors_from_bytes((tmp_path / "t.safetensors").read_bytes())):
        assert set(read) == set(written)
        for name, array in written.items():
            assert read[name].dtype == array.dtype and read[name].shape == array.shape, name
            assert np.array_equal(read[name].reshape(-1).view(np.uint8), array.reshape(-1).view(np.uint8)), name  # bits
    from safetensors import safe_open

    with safe_open(str(tmp_path / "t.safetensors"), framework="numpy") as theirs:  # the dtypes it does know
        for name in ("f32", "f16", "i64", "flag"):
            assert np.array_equal(theirs.get_tensor(name), read_safetensors(tmp_path / "t.safetensors")[name])


@pytest.mark.parametrize("damage", ["short", "header_length", "not_json", "past_the_end", "unknown_dtype"])
def test_a_file_that_is_no_safetensors_file_is_one_line(tmp_path, damage):
    save_file({"w": np.ones((4, 4), np.float32)}, str(tmp_path / "ok.safetensors"))
    data = (tmp_path / "ok.safetensors").read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = data[8: 8 + length]
    bad = {"short": data[:5], "header_length": (10**9).to_bytes(8, "little") + data[8:],
           "not_json": data[:8] + b"\xff" * length + data[8 + length:],
           "past_the_end": data[:-8],
           "unknown_dtype": data[:8] + header.replace(b'"F32"', b'"X32"') + data[8 + length:]}[damage]
    (tmp_path / "bad.safetensors").write_bytes(bad)
    for read in (lambda: read_safetensors(tmp_path / "bad.safetensors"), lambda: tensors_from_bytes(bad, "bad")):
        with pytest.raises(UnreadableTensors) as caught:
            read()
        assert "\n" not in str(caught.value) and "bad" in str(caught.value)


def test_a_bfloat16_component_converts_as_its_float32_weights_rounded(tiny_model_dir, tmp_path):
    """A UNet saved by PyTorch in bfloat16 (diffusers' layout) becomes the same Flax params as the float32
    one's, rounded to bfloat16."""
    from diffusers import FlaxUNet2DConditionModel
    from flax.traverse_util import flatten_dict

    from helpers.pt_layout import pytorch_state_dict
    from sdjax_runner.models.checkpoints import convert_safetensors

    module, params = FlaxUNet2DConditionModel.from_pretrained(tiny_model_dir, subfolder="unet")
    state = {name: value.astype(BF16) for name, value in pytorch_state_dict(params, "diffusers").items()}
    save_file(state, str(tmp_path / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    converted = flatten_dict(convert_safetensors((tmp_path / "diffusion_pytorch_model.safetensors",), module,
                                                 "diffusers", np.dtype(np.float32)))
    expected = flatten_dict(params)
    assert set(converted) == set(expected)
    for path, value in expected.items():
        assert np.array_equal(converted[path], np.asarray(value).astype(BF16).astype(np.float32)), path


def test_a_bfloat16_lora_reads_as_its_float32_factors_rounded(tiny_model_dir, tmp_path):
    from sdjax_runner.models import lora

    updates = lora_files.factors(tiny_model_dir)
    rounded = {key: (a.astype(BF16), b.astype(BF16)) for key, (a, b) in updates.items()}
    params = lora_files.host_params(tiny_model_dir)
    as_bf16 = lora.read(str(lora_files.write_kohya(tmp_path / "bf16.safetensors", rounded, alpha=2.0)), params, "lora")
    as_f32 = lora.read(str(lora_files.write_kohya(tmp_path / "f32.safetensors", {
        key: (a.astype(np.float32), b.astype(np.float32)) for key, (a, b) in rounded.items()}, alpha=2.0)),
        params, "lora")
    assert set(as_bf16.factors) == set(as_f32.factors) == set(updates)
    for key, (down, up) in as_f32.factors.items():
        assert np.array_equal(np.asarray(as_bf16.factors[key][0], np.float32), np.asarray(down, np.float32))
        assert np.array_equal(np.asarray(as_bf16.factors[key][1], np.float32), np.asarray(up, np.float32))
