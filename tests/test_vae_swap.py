"""model.vae (issue #49): another VAE for a loaded model, as A1111's "SD VAE" swaps it. The reference is the model
itself with that VAE in its folder, loaded as any published folder is: a run with ``model.vae`` -- a diffusers VAE
folder, or the same weights as one file in the original (LDM) layout -- must give that folder's images bit for
bit, a sweep over VAEs must load the model once (and, the VAE configs alike, compile once), and the records,
the A1111 line and re-runs must name the VAE."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli

QUIET = ["tracking=none", "metrics.clip_score.enabled=false", "sampling.num_inference_steps=3",
         "parallelism.num_devices=2", "compilation_cache.executables=false"]


@pytest.fixture(scope="module")
def vaes(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """tiny-random's VAE with other weights (its own perturbed, a fixed seed) as a diffusers folder with PyTorch
    safetensors, as one LDM-layout file (bare encoder./decoder. names, as vae-ft-mse-840000-ema-pruned has them,
    with an EMA leftover A1111 skips), and the reference: a copy of the model whose vae/ is that folder."""
    from flax.serialization import msgpack_restore
    from flax.traverse_util import flatten_dict, unflatten_dict
    from safetensors.numpy import save_file

    from helpers.ldm_layout import ldm_vae
    from helpers.pt_layout import pytorch_state_dict

    root = tmp_path_factory.mktemp("vaes")
    params = flatten_dict(msgpack_restore((tiny_model_dir / "vae" / "diffusion_flax_model.msgpack").read_bytes()))
    rng = np.random.default_rng(3)
    other = unflatten_dict({key: (value + 0.3 * np.std(value) * rng.standard_normal(value.shape)).astype(np.float32)
                            if value.size > 1 else value for key, value in params.items()})
    state = pytorch_state_dict(other, "diffusers")
    folder = root / "other-vae"
    folder.mkdir()
    shutil.copy(tiny_model_dir / "vae" / "config.json", folder / "config.json")
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    levels = len(json.loads((folder / "config.json").read_text())["block_out_channels"])
    single = root / "other, vae.safetensors"  # a comma in the name: the A1111 line quotes it
    save_file(dict(ldm_vae(state, levels), **{"model_ema.decay": np.array(0.999, np.float32)}), str(single))
    reference = root / "reference-model"
    shutil.copytree(tiny_model_dir, reference)
    shutil.rmtree(reference / "vae")
    shutil.copytree(folder, reference / "vae")
    index = json.loads((reference / "model_index.json").read_text())
    index["vae"] = ["diffusers", "AutoencoderKL"]
    (reference / "model_index.json").write_text(json.dumps(index))
    return {"folder": folder, "single": single, "reference": reference}


def _hashes(run_dir: Path) -> list[str]:
    return [record["pixels_sha256"] for record in json.loads((run_dir / "images.json").read_text())]


def test_a_vae_sweep_gives_the_folders_images_and_loads_the_model_once(tmp_path, tiny_model_dir, vaes):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", *QUIET, f"model.vae={vaes['folder']},'{vaes['single']}'",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = run_cli("+experiment=smoke", *QUIET, "model=local",
                        f"model.pretrained_model_name_or_path={vaes['reference']}", "hydra.run.dir=reference",
                        cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    plain = run_cli("+experiment=smoke", *QUIET, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    expected = _hashes(tmp_path / "reference")
    assert _hashes(sweep / "0") == expected and _hashes(sweep / "1") == expected
    assert _hashes(tmp_path / "plain") != expected  # the VAE made the difference
    second = json.loads((sweep / "1" / "timings.json").read_text())
    assert second["process_model_loads"] == 1  # the model stayed; only its VAE was read again
    assert second["compile_reused"] == 1  # the same VAE config: the same program
    said = result.stdout + result.stderr
    assert "load: VAE other-vae (its own config)" in said and "load: VAE other, vae.safetensors (on the model's" in said
    records = [json.loads((sweep / job / "images.json").read_text())[0] for job in ("0", "1")]
    assert records[1]["vae"].startswith("other, vae.safetensors:sha256=")
    with Image.open(sweep / "1" / records[1]["file"]) as image:
        parameters = image.text["parameters"]
    sha = records[1]["vae"].rpartition("sha256=")[2]
    assert f'VAE hash: {sha[:10]}, VAE: "other, vae.safetensors"' in parameters
    rerun = run_cli(str(sweep / "1"), command="rerun", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "rerun: identical" in rerun.stdout + rerun.stderr
    remade = run_cli(str(sweep / "1" / records[1]["file"]), *QUIET[:2], "hydra.run.dir=from_png", command="from_png",
                     cwd=tmp_path)
    assert remade.returncode == 0, remade.stderr[-3000:]
    assert "VAE: other, vae.safetensors: VAE files are not found by name here; give model.vae=PATH" in \
        remade.stdout + remade.stderr


def test_a_vae_that_does_not_fit_or_is_no_vae_is_one_line(tmp_path, tiny_xl_dir, vaes):
    from safetensors.numpy import save_file

    pickled = tmp_path / "vae.pt"
    pickled.write_bytes(b"not read: unpickling runs code")
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", f"model.vae={pickled}", cwd=tmp_path),
                          "error: model.vae: vae.pt is not a .safetensors file; pickled VAEs (.ckpt, .pt, .bin) can "
                          "run code")
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", f"model.vae={tmp_path / 'nowhere'}",
                                   cwd=tmp_path), "error: model.vae: ")
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", f"model.vae={empty}", cwd=tmp_path),
                          "error: model.vae: ")
    strange = tmp_path / "strange.safetensors"
    save_file({"decoder.nonsense.weight": np.zeros(3, np.float32)}, str(strange))
    result = run_cli("+experiment=smoke", *QUIET, f"model.vae={strange}", "hydra.run.dir=strange", cwd=tmp_path)
    assert_one_line_error(result, "error: model.vae: does not fit")
    assert "decoder.nonsense.weight is no tensor of a VAE in the original (LDM) layout" in result.stderr
    sd3_vae = Path(__file__).resolve().parent / "fixtures" / "sd3" / "tiny-sd3" / "vae"  # 16 latent channels
    result = run_cli("+experiment=smoke", *QUIET, f"model.vae={sd3_vae}", "hydra.run.dir=sd3", cwd=tmp_path)
    assert_one_line_error(result, "error: model.vae: vae has 16 latent channels, the model's VAE 4")
    # tiny-random-xl's VAE has SD's shapes and its own scaling factor: it runs on its own config (A1111 swaps
    # SD and SDXL VAEs alike), a program of its own
    result = run_cli("+experiment=smoke", *QUIET, f"model.vae={tiny_xl_dir / 'vae'}", "hydra.run.dir=xl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "load: VAE vae (its own config)" in result.stdout + result.stderr


@pytest.mark.slow
def test_a_flow_models_vae_swaps_as_a_folder_and_as_one_file(tmp_path):
    # tiny-sd3 (FLUX.1's 16-channel VAE module): its VAE perturbed, as a diffusers folder and as one LDM-layout file
    # under first_stage_model. (as SD 3 checkpoints carry it); the reference is the model with that folder as vae/.
    from safetensors.numpy import load_file, save_file

    from helpers.ldm_layout import ldm_vae

    model = Path(__file__).resolve().parent / "fixtures" / "sd3" / "tiny-sd3"
    state = load_file(model / "vae" / "diffusion_pytorch_model.safetensors")
    rng = np.random.default_rng(4)
    state = {k: (v + 0.3 * np.std(v) * rng.standard_normal(v.shape)).astype(v.dtype) if v.size > 1 else v
             for k, v in state.items()}
    folder = tmp_path / "sd3-vae"
    shutil.copytree(model / "vae", folder)
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    levels = len(json.loads((folder / "config.json").read_text())["block_out_channels"])
    single = tmp_path / "sd3-vae.safetensors"
    save_file({f"first_stage_model.{k}": v for k, v in ldm_vae(state, levels).items()}, str(single))
    reference = tmp_path / "reference-model"
    shutil.copytree(model, reference)
    shutil.rmtree(reference / "vae")
    shutil.copytree(folder, reference / "vae")
    common = ["model=local", "prompts.max_sequence_length=16", "sampling.num_inference_steps=2", "sampling.height=32",
              "sampling.width=32", "tracking=none", "metrics.clip_score.enabled=false",
              "parallelism.num_devices=2"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *common, f"model.pretrained_model_name_or_path={model}", f"model.vae={folder},{single}",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = run_cli(*common, f"model.pretrained_model_name_or_path={reference}", "hydra.run.dir=reference",
                       cwd=tmp_path)
    assert expected.returncode == 0, expected.stderr[-3000:]
    plain = run_cli(*common, f"model.pretrained_model_name_or_path={model}", "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert _hashes(sweep / "0") == _hashes(tmp_path / "reference") == _hashes(sweep / "1")
    assert _hashes(tmp_path / "plain") != _hashes(tmp_path / "reference")
