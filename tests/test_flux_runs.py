"""FLUX.1 through the command line, as a user runs it: a published-layout folder (diffusers' PyTorch FluxPipeline
saved it: tests/fixtures/flux/) gives, through ``python -m sdjax_runner model=local``, the PNGs of diffusers'
PyTorch pipeline called with the runner's noise, for [dev] and [schnell]; the built-in tiny FLUX model's
experiment writes its images, Forge's infotext and an MLflow run; a guidance sweep loads and compiles once;
the sharded mode gives the pmap mode's images; and what FLUX.1 cannot honour is one line before anything
loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "flux"
QUIET = ("tracking=none", "metrics.clip_score.enabled=false")


def _records(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "images.json").read_text())


def _pixels(run_dir: Path, record: dict) -> np.ndarray:
    with Image.open(run_dir / record["file"]) as image:
        return np.asarray(image, dtype=np.float32) / 255


def _reference_run(variant: str, tmp_path: Path, cache_dir: Path, *extra: str,
                   reference: str = "") -> tuple[Path, dict]:
    """The reference's settings (tests/fixtures/flux/README.md) as command-line overrides, on its folder."""
    ref = dict(np.load(FIXTURES / f"{reference or f'pipeline_{variant}'}.npz"))
    run_dir = tmp_path / f"run-{variant}{len(extra)}"
    guidance = [f"sampling.guidance_scale={float(ref['guidance_scale'])}"] if variant == "dev" else []
    result = run_cli("model=local", f"model.pretrained_model_name_or_path={FIXTURES / f'tiny-flux-{variant}'}",
                     "dtype=fp32", f"prompts.texts=[{ref['prompt']}]", f"seed={int(ref['seed'])}",
                     f"sampling.num_inference_steps={int(ref['steps'])}", *guidance,
                     f"sampling.height={int(ref['height'])}", f"sampling.width={int(ref['width'])}",
                     f"prompts.max_sequence_length={int(ref['max_sequence_length'])}",
                     f"parallelism.num_devices={int(ref['num_devices'])}", *QUIET, *extra,  # the reference's noise
                     f"paths.output_root={tmp_path}", f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, ref


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dev", "schnell"])
def test_a_published_flux_folder_gives_diffusers_pytorch_images_from_the_command_line(variant, tmp_path, cache_dir):
    run_dir, ref = _reference_run(variant, tmp_path, cache_dir)
    records = _records(run_dir)
    assert [r["device"] for r in records] == list(range(int(ref["num_devices"])))
    for record in records:
        difference = np.abs(_pixels(run_dir, record) - ref["images"][record["device"]]).max()
        assert difference <= 2 / 255, difference  # issue #46's bound, through the PNG's 8 bits
        assert record["family"] == "flux" and record["sampler"] == "Euler" and "guidance_scale" not in record
        assert record.get("distilled_guidance") == (3.5 if variant == "dev" else None)
    if variant == "dev":  # the sharded mode (jit over a mesh) gives the pmap mode's images
        sharded_dir, _ = _reference_run(variant, tmp_path, cache_dir, "parallelism=sharded")
        assert [r["pixels_sha256"] for r in _records(sharded_dir)] == [r["pixels_sha256"] for r in records]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, cache_dir):
    """``+experiment=flux_smoke`` with MLflow and its CLIP score, as the docs run it."""
    work = tmp_path_factory.mktemp("flux-smoke")
    result = run_cli("+experiment=flux_smoke", f"paths.cache_dir={cache_dir}", "hydra.run.dir=run", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    return work, result


@pytest.mark.slow
def test_the_flux_experiment_writes_images_forges_infotext_and_an_mlflow_run(smoke):
    work, result = smoke
    run_dir = work / "run"
    records = _records(run_dir)
    assert len(records) == 8 and len({r["pixels_sha256"] for r in records}) == 8  # 8 devices, 8 noises
    assert all(r["clip_score"] >= 0 for r in records)  # judged as every run is (the experiment's tiny CLIP)
    for record in records:
        pixels = _pixels(run_dir, record)
        assert pixels.shape == (32, 32, 3) and pixels.std() > 0
    with Image.open(run_dir / records[0]["file"]) as image:
        parameters = image.info["parameters"]
    assert "Steps: 4, Sampler: Euler, CFG scale: 1, Distilled CFG Scale: 3.5, Seed: 0, Size: 32x32, " \
           "Model: tiny-random-flux" in parameters
    said = result.stdout + result.stderr
    assert "plan: 8 image(s)" in said and "tiny-random-flux fp32, Euler 4 steps" in said

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    # (the module's other tests re-run this run into the same store: its run is the one named as the experiment)
    (run,) = client.search_runs([client.get_experiment_by_name("sdjax-runner").experiment_id],
                                filter_string="tags.`mlflow.runName` = 'flux_smoke'")
    params = run.data.params
    assert params["model.family"] == "flux" and params["sampler"] == "Euler"
    assert params["scheduler.name"] == "flow_match_euler"  # what ran, though the root config's default is pndm
    assert params["sampling.guidance_scale"] == "3.5" and params["prompts.max_sequence_length"] == "16"
    assert run.data.metrics["flops_per_batch"] > 0
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["flops_per_batch"] == run.data.metrics["flops_per_batch"]


@pytest.mark.slow
def test_a_flux_run_is_remade_bit_for_bit_from_its_stored_executable_and_its_png_is_read_as_flux(smoke, cache_dir):
    work, _ = smoke
    result = run_cli(str(work / "run"), command="rerun", cwd=work)  # its recorded config names the cache
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rerun: identical -- all 8 image(s) match" in result.stdout + result.stderr
    (rerun_dir,) = (work / "outputs" / "reruns").glob("*/*")
    assert json.loads((rerun_dir / "timings.json").read_text())["compile_path"] == "executable_cache"  # stored
    png = work / "run" / _records(work / "run")[0]["file"]
    result = run_cli(str(png), *QUIET, "parallelism.host_device_count=8", "prompts.max_sequence_length=16",
                     f"paths.cache_dir={cache_dir}", "hydra.run.dir=from_png", command="from_png", cwd=work)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    assert "Distilled CFG Scale: 3.5 -> sampling.guidance_scale=3.5" in said, said
    assert "not honoured: CFG scale: 1: FLUX.1 runs no classifier-free guidance" in said
    assert "prompts.syntax=a1111" not in said
    # The PNG's settings remake device 0's image when the run is laid out as the PNG's was (8 devices); the T5
    # length is not in an infotext (Forge writes none): the experiment's 16 is given again.
    remade = _records(work / "from_png")[0]
    assert remade["pixels_sha256"] == _records(work / "run")[0]["pixels_sha256"]


@pytest.mark.slow
def test_a_guidance_sweep_loads_and_compiles_once(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=flux_smoke", "sampling.guidance_scale=1.5,5", *QUIET,
                     "compilation_cache.executables=false", "parallelism.num_devices=2",
                     f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    timings = [json.loads((sweep / str(job) / "timings.json").read_text()) for job in (0, 1)]
    assert [t["process_model_loads"] for t in timings] == [1, 1]
    assert [t["process_compiles"] for t in timings] == [1, 1]  # the guidance is an input: one program
    images = [[r["pixels_sha256"] for r in _records(sweep / str(job))] for job in (0, 1)]
    assert images[0] != images[1]  # the embedded guidance changes the images


# Each refused before anything loads (a FLUX.1 model planned from its catalogue entry or its folder's index).
REFUSED = {
    "negative prompt": (["prompts.negative=blurry"], "error: prompts.negative: tiny-random-flux is FLUX.1, which is "
                        "guidance-distilled: it reads a negative prompt only with true classifier-free guidance"),
    "true CFG, no negative": (["sampling.true_cfg_scale=4"], "error: sampling.true_cfg_scale: 4.0: true "
                              "classifier-free guidance needs a negative prompt"),
    "true CFG of 1": (["sampling.true_cfg_scale=1", "prompts.negative=x"], "error: sampling.true_cfg_scale: 1.0: "
                      "true classifier-free guidance runs above 1"),
    "A1111 syntax": (["prompts.syntax=a1111"], "error: prompts.syntax: a1111: A1111's emphasis and BREAK weigh"),
    "T5 too long": (["prompts.max_sequence_length=513"], "error: prompts.max_sequence_length: 513: FLUX.1's T5 "
                    "reads at most 512 tokens (allowed: 1..512"),
    "an SDE sampler": (["sampler=dpmpp_2m_sde"], "error: sampler: dpmpp_2m_sde: the flow models (FLUX.1, SD 3) run euler, heun, dpmpp_2m"),
    "an SD scheduler": (["scheduler=ddim"], "error: scheduler: ddim: the flow models (FLUX.1, SD 3) step with their own flow_match_euler"),
    "clip skip": (["prompts.clip_skip=2"], "error: prompts.clip_skip: 2: FLUX.1 reads CLIP's pooled output"),
    "eta": (["sampling.eta=0.5"], "error: sampling.eta: the flow models' samplers (FLUX.1, SD 3) add no noise"),
    "unknown family": (["model.family=sd4"], "error: model.family: unknown model family 'sd4' (allowed: sd, flux, sd3, flux2)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_flux_cannot_honour_is_one_line_before_anything_loads(case, tmp_path):
    overrides, expected = REFUSED[case]
    assert_one_line_error(call_cli("+experiment=flux_smoke", *QUIET, *overrides, cwd=tmp_path), expected)
    assert not [path for path in tmp_path.rglob("*.png") if path.is_file()]  # no image made


@pytest.mark.slow
def test_true_cfg_with_a_negative_prompt_gives_diffusers_pytorch_images(tmp_path, cache_dir):
    """FluxPipeline(negative_prompt=..., true_cfg_scale=...) on [dev]: two transformer calls a step, mixed as
    neg + scale * (pos - neg); the PNGs within 2/255 of PyTorch's; the records say Forge's CFG scale."""
    ref = dict(np.load(FIXTURES / "pipeline_dev_true_cfg.npz"))
    run_dir, _ = _reference_run("dev", tmp_path, cache_dir, f"prompts.negative={ref['negative_prompt']}",
                                f"sampling.true_cfg_scale={float(ref['true_cfg_scale'])}",
                                reference="pipeline_dev_true_cfg")
    plain = dict(np.load(FIXTURES / "pipeline_dev.npz"))["images"]
    for record in _records(run_dir):
        pixels = _pixels(run_dir, record)
        assert np.abs(pixels - ref["images"][record["device"]]).max() <= 2 / 255
        assert np.abs(pixels - plain[record["device"]]).max() > 10 / 255  # true CFG changed the image
        assert record["guidance_scale"] == 4.0 and record["distilled_guidance"] == 3.5
        assert record["negative_prompt"] == "blurry"
    with Image.open(run_dir / _records(run_dir)[0]["file"]) as image:
        parameters = image.info["parameters"]
    assert "\nNegative prompt: blurry\n" in parameters and "CFG scale: 4.0, Distilled CFG Scale: 3.5" in parameters


def test_sd_models_refuse_flux_settings_in_one_line(tmp_path):
    assert_one_line_error(call_cli("+experiment=smoke", *QUIET, "prompts.max_sequence_length=256", cwd=tmp_path),
                          "error: prompts.max_sequence_length: 256: tiny-random has no T5 encoder")
    assert_one_line_error(call_cli("+experiment=smoke", *QUIET, "scheduler=flow_match_euler", cwd=tmp_path),
                          "error: scheduler: flow_match_euler is FLUX.1's scheduler")
    assert_one_line_error(call_cli("+experiment=smoke", *QUIET, "sampling.true_cfg_scale=4", cwd=tmp_path),
                          "error: sampling.true_cfg_scale: 4.0: tiny-random's classifier-free guidance is "
                          "sampling.guidance_scale")


@pytest.mark.slow
def test_schnell_refuses_a_guidance_value_and_a_family_mismatch_is_one_line(tmp_path, cache_dir):
    schnell = FIXTURES / "tiny-flux-schnell"
    common = ("model=local", f"model.pretrained_model_name_or_path={schnell}", "sampling.height=32",
              "sampling.width=32", "sampling.num_inference_steps=1", "prompts.max_sequence_length=8", *QUIET,
              f"paths.cache_dir={cache_dir}")
    assert_one_line_error(call_cli(*common, "sampling.guidance_scale=3.5", cwd=tmp_path),
                          "error: sampling.guidance_scale: 3.5, but local is FLUX.1 [schnell] (its transformer has no "
                          "guidance embedder): it reads no guidance (allowed: null)")
    tiny_sd = cache_dir / "models" / "tiny-random-v2"
    from sdjax_runner.models.builtin import build_builtin

    build_builtin("tiny-random", tiny_sd)
    assert_one_line_error(call_cli("model=local", f"model.pretrained_model_name_or_path={tiny_sd}", "model.family=flux",
                                   "sampling.num_inference_steps=1", *QUIET, f"paths.cache_dir={cache_dir}",
                                   cwd=tmp_path),
                          f"error: model.family: {tiny_sd} holds a Stable Diffusion 1.x, 2.x and XL")


# A FLUX.1 LoRA in diffusers' / PEFT's layout for the tiny model: PyTorch module paths of its transformer (and CLIP).
LORA_MODULES = {"transformer.transformer_blocks.0.attn.to_q": (32, 32),
                "transformer.single_transformer_blocks.0.proj_out": (160, 32),
                "transformer.transformer_blocks.0.ff.net.2": (128, 32),
                "text_encoder.text_model.encoder.layers.0.self_attn.q_proj": (32, 32)}


def _write_flux_lora(path: Path, rank: int = 4) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    tensors = {}
    for module, (fan_in, fan_out) in LORA_MODULES.items():
        tensors[module + ".lora_A.weight"] = (0.5 * rng.standard_normal((rank, fan_in))).astype(np.float32)
        tensors[module + ".lora_B.weight"] = (0.5 * rng.standard_normal((fan_out, rank))).astype(np.float32)
    save_file(tensors, str(path))
    return path


_KOHYA_RNG = np.random.default_rng(11)
# kohya's FLUX.1 LoRA names (Black Forest Labs' modules, fused q/k/v and linear1), rank 4, alpha 8.
KOHYA_TENSORS = {
    **{f"lora_unet_{module}.lora_down.weight": _KOHYA_RNG.standard_normal((4, fan_in)).astype(np.float32)
       for module, (fan_in, _) in {"double_blocks_0_img_attn_qkv": (32, 96), "single_blocks_0_linear1": (32, 224),
                                   "single_blocks_0_linear2": (160, 32)}.items()},
    **{f"lora_unet_{module}.lora_up.weight": _KOHYA_RNG.standard_normal((fan_out, 4)).astype(np.float32)
       for module, (_, fan_out) in {"double_blocks_0_img_attn_qkv": (32, 96), "single_blocks_0_linear1": (32, 224),
                                    "single_blocks_0_linear2": (160, 32)}.items()},
    **{f"lora_unet_{module}.alpha": np.float32(8.0) for module in ("double_blocks_0_img_attn_qkv",
                                                                  "single_blocks_0_linear1", "single_blocks_0_linear2")},
}


def _write_kohya_flux_lora(path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file({key: np.asarray(value) for key, value in KOHYA_TENSORS.items()}, str(path))
    return path


def test_a_flux_lora_is_matched_to_the_transformers_kernels(tmp_path, cache_dir):
    from sdjax_runner.config.schema import DtypeConfig, ModelConfig
    from sdjax_runner.errors import UserError
    from sdjax_runner.models import lora
    from sdjax_runner.models.builtin import build_builtin
    from sdjax_runner.models.loaders import load_model

    folder = build_builtin("tiny-random-flux", cache_dir / "models" / "tiny-random-flux-v1")
    weights = load_model(ModelConfig(name="tiny", pretrained_model_name_or_path=str(folder)),
                         DtypeConfig(name="fp32")).host_weights
    adapter = lora.read(str(_write_flux_lora(tmp_path / "flux.safetensors")), weights, "lora.0.path")
    assert set(adapter.factors) == {
        ("transformer", ("transformer_blocks_0", "attn", "to_q", "kernel")),
        ("transformer", ("single_transformer_blocks_0", "proj_out", "kernel")),
        ("transformer", ("transformer_blocks_0", "ff", "net_2", "kernel")),
        ("text_encoder", ("text_model", "encoder", "layers", "0", "self_attn", "q_proj", "kernel"))}
    down, up = adapter.factors[("transformer", ("single_transformer_blocks_0", "proj_out", "kernel"))]
    assert down.shape == (160, 4) and up.shape == (4, 32)  # alpha = rank: the update is A.T @ B.T
    # kohya's FLUX layout: BFL names; a fused q/k/v's up factor is cut into the three projections' rows
    from sdjax_runner.models.loaders import LOADERS

    renaming = LOADERS["flux"].lora_modules  # (the engine passes the loaded model's family's)
    kohya = lora.read(str(_write_kohya_flux_lora(tmp_path / "kohya.safetensors")), weights, "lora.0.path", None,
                      renaming)
    assert set(kohya.factors) == {("transformer", ("transformer_blocks_0", "attn", name, "kernel"))
                                  for name in ("to_q", "to_k", "to_v")} | {
        ("transformer", ("single_transformer_blocks_0", "attn", name, "kernel")) for name in ("to_q", "to_k", "to_v")
    } | {("transformer", ("single_transformer_blocks_0", "proj_mlp", "kernel")),
         ("transformer", ("single_transformer_blocks_0", "proj_out", "kernel"))}
    tensors = KOHYA_TENSORS
    for i, name in enumerate(("to_q", "to_k", "to_v")):  # alpha 8, rank 4: the update is 2 A.T @ B.T
        down, up = kohya.factors[("transformer", ("transformer_blocks_0", "attn", name, "kernel"))]
        qkv_up = tensors["lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"][32 * i: 32 * (i + 1)]
        np.testing.assert_allclose(down @ up, 2 * tensors["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"].T
                                   @ qkv_up.T, rtol=1e-6)
    down, up = kohya.factors[("transformer", ("single_transformer_blocks_0", "proj_mlp", "kernel"))]
    assert up.shape == (4, 128)  # linear1's last 128 rows: the MLP's input
    with pytest.raises(UserError, match=re.escape("lora_unet_double_blocks_0_img_nonsense is no module of a FLUX.1")):
        bad = tmp_path / "bad.safetensors"
        from safetensors.numpy import save_file

        save_file({"lora_unet_double_blocks_0_img_nonsense.lora_down.weight": np.zeros((4, 32), np.float32),
                   "lora_unet_double_blocks_0_img_nonsense.lora_up.weight": np.zeros((32, 4), np.float32)}, str(bad))
        lora.read(str(bad), weights, "lora.0.path", None, renaming)


@pytest.mark.slow
def test_a_flux_lora_scale_sweep_compiles_once_and_scale_zero_is_the_model(tmp_path, cache_dir):
    adapter = _write_flux_lora(tmp_path / "flux.safetensors")
    sweep = tmp_path / "sweep"
    common = ("+experiment=flux_smoke", *QUIET, "compilation_cache.executables=false",
              "parallelism.num_devices=2", f"paths.cache_dir={cache_dir}")
    result = run_cli("-m", *common, f"lora=[{{path: {adapter}}}]", "lora.0.scale=0,1",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plain = run_cli(*common, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    timings = [json.loads((sweep / str(job) / "timings.json").read_text()) for job in (0, 1)]
    assert [t["process_compiles"] for t in timings] == [1, 1]  # the scale is an input: one program
    images = [[r["pixels_sha256"] for r in _records(sweep / str(job))] for job in (0, 1)]
    assert images[0] == [r["pixels_sha256"] for r in _records(tmp_path / "plain")]  # scale 0: the model itself
    assert images[1] != images[0]
    assert "lora: flux.safetensors at scale 1 merged into 4 layer(s) (text_encoder 1, transformer 3)" \
        in result.stdout + result.stderr


def _bfl_file(path: Path, variant: str = "dev", prefix: str = "") -> tuple[Path, dict]:
    """The fixture's transformer saved as a single file in Black Forest Labs' layout (tests/helpers/bfl_layout.py)."""
    from safetensors.numpy import save_file

    from helpers.bfl_layout import to_bfl
    from sdjax_runner.families.flux.models.convert import read_safetensors

    folder = FIXTURES / f"tiny-flux-{variant}" / "transformer"
    state = {name: np.array(array) for name, array in read_safetensors(folder).items()}
    config = json.loads((folder / "config.json").read_text())
    save_file(to_bfl(state, config["num_layers"], config["num_single_layers"], prefix), str(path))
    return path, state


def test_a_bfl_single_file_transformer_is_renamed_to_the_folders_tensors(tmp_path):
    from sdjax_runner.config.families import open_checkpoint
    from sdjax_runner.families.flux.models.convert import load_safetensors
    from sdjax_runner.families.flux.models.single_file import diffusers_state_dict

    for variant, prefix in (("dev", ""), ("schnell", "model.diffusion_model.")):
        path, state = _bfl_file(tmp_path / f"{variant}.safetensors", variant, prefix)
        assert open_checkpoint(path).architecture == f"flux-{variant}"
        renamed = diffusers_state_dict(load_safetensors(path), 2 * 16, path.name)
        assert set(renamed) == set(state)
        for name, array in state.items():
            assert np.array_equal(np.asarray(renamed[name]), array), name


@pytest.mark.slow
def test_a_bfl_single_file_checkpoint_runs_on_its_base_folder_with_the_folders_images(tmp_path, cache_dir):
    checkpoint, _ = _bfl_file(tmp_path / "flux1-dev.safetensors", "dev", "model.diffusion_model.")
    run_dir, ref = _reference_run("dev", tmp_path, cache_dir, f"model.checkpoint={checkpoint}")
    records = _records(run_dir)
    for record in records:  # the PyTorch pipeline's images, as from the folder's own transformer
        assert np.abs(_pixels(run_dir, record) - ref["images"][record["device"]]).max() <= 2 / 255
        assert record["checkpoint"].startswith("flux1-dev.safetensors:sha256=")
    inputs = json.loads((run_dir / "inputs.json").read_text())
    assert "flux1-dev.safetensors" in json.dumps(inputs)
    # A [dev] checkpoint on the [schnell] folder does not fit its config (no guidance embedder): one line.
    result = call_cli("model=local", f"model.pretrained_model_name_or_path={FIXTURES / 'tiny-flux-schnell'}",
                      f"model.checkpoint={checkpoint}", "sampling.height=32", "sampling.width=32",
                      "sampling.num_inference_steps=1", *QUIET, f"paths.cache_dir={cache_dir}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.checkpoint: does not fit the base model {FIXTURES / 'tiny-flux-schnell'} "
                          "(FLUX.1 [dev] checkpoint)")


@pytest.mark.slow
def test_the_tiny_schnell_experiment_runs_with_no_hub_and_reads_no_guidance(tmp_path):
    """Round five: +experiment=flux_schnell needs the hub; flux_schnell_smoke runs the same settings on a built-in
    tiny FLUX.1 [schnell] (no guidance embedder, schnell's scheduler config)."""
    import json

    from helpers.cli import assert_one_line_error, call_cli

    result = call_cli("+experiment=flux_schnell_smoke", "tracking=none", "metrics.clip_score.enabled=false",
                      f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    assert len(records) == 8 and records[0]["model"] == "tiny-random-flux-schnell"
    assert records[0].get("guidance_scale") is None  # schnell reads none
    folder = json.loads((tmp_path / "run" / "inputs.json").read_text())["model"]["path"]
    config = json.loads((Path(folder) / "transformer" / "config.json").read_text())
    scheduler = json.loads((Path(folder) / "scheduler" / "scheduler_config.json").read_text())
    assert config["guidance_embeds"] is False and (scheduler["shift"], scheduler["use_dynamic_shifting"]) == (1.0, False)
    result = call_cli("+experiment=flux_schnell_smoke", "sampling.guidance_scale=3", cwd=tmp_path)
    assert_one_line_error(result, "error: sampling.guidance_scale: ")
