"""Perturbed-attention guidance on SD 3's transformer (``guider=pag``, issue #62 item 1): in the self-attention modules
``guider.layers`` picks (diffusers' ``pag_applied_layers`` rule on the transformer's PyTorch names,
``transformer_blocks.1.attn``; the default ``blocks.1`` as diffusers'), a third chunk of the batch -- the
conditional input -- attends with each image token seeing itself alone among the image tokens.

Against diffusers' own ``StableDiffusion3PAGPipeline`` (0.39) on an SD 3.0-shaped tiny pipeline from the runner's
initial latents: ``tests/fixtures/pag_sd3``, made by ``tests/helpers/make_sd3_pag_reference.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from helpers.images import images_of

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = np.load(FIXTURES / "pag_sd3" / "pag.npz")
TOLERANCE = 2  # 8-bit levels (the 2/255)
# The reference's settings: 4 steps of SD 3's Euler at 32 x 32, 32 T5 tokens, seed 0 on 2 devices (its latents are
# the runner's), its prompt.
RUN = ["dtype=fp32", "sampling.num_inference_steps=4", "sampling.height=32", "sampling.width=32",
       "parallelism.num_devices=2", f"prompts.texts=[{REFERENCE['prompt']}]", "prompts.max_sequence_length=32",
       "tracking=none", "metrics.clip_score.enabled=false", "seed=0"]


def sd3_medium_folder(out: Path) -> Path:
    """tiny-sd3 with SD 3.0's transformer shape, as the reference maker assembles it (its sd3_medium_folder)."""
    shutil.copytree(FIXTURES / "sd3" / "tiny-sd3", out)
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        shutil.copyfile(FIXTURES / "sd3" / "transformer-sd3" / name, out / "transformer" / name)
    return out


def levels_off(run_dir: Path, case: str, reference=REFERENCE) -> float:
    ours = np.stack(images_of(run_dir)).astype(np.float64)
    return float(np.abs(ours - np.round(reference[case].astype(np.float64) * 255)).max())


def settings(case: str) -> dict:
    return json.loads(str(REFERENCE[f"{case}_settings"]))


@pytest.mark.slow
def test_pag_on_sd3_is_diffusers_sd3_pag_pipeline_and_a_scale_and_guidance_sweep_compiles_once(tmp_path):
    folder = sd3_medium_folder(tmp_path / "tiny-sd3-medium")
    model = ["model=local", f"model.pretrained_model_name_or_path={folder}"]
    assert settings("blocks_1")["layers"] == ["blocks.1"] and settings("blocks_1")["pag_scale"] == 20
    # the family's default layers (diffusers' blocks.1); PAG's scale and the guidance traced: one program
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *model, *RUN, "guider=pag", "guider.scale=20,0", "sampling.guidance_scale=5,1",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {}
    for job in sweep.glob("[0-9]"):
        record = json.loads((job / "images.json").read_text())[0]
        settings_ = dict(item.split("=") for item in record["guider_settings"].split())
        jobs[(float(settings_["scale"]), record["guidance_scale"])] = job
        assert record["guider"] == "pag" and record["guider_layers"] == ["blocks.1"]
    cases = {(20.0, 5.0): "blocks_1", (20.0, 1.0): "no_cfg", (0.0, 5.0): "plain", (0.0, 1.0): "plain_no_cfg"}
    for point, case in cases.items():
        assert levels_off(jobs[point], case) <= TOLERANCE, case
    assert levels_off(jobs[(20.0, 5.0)], "plain") > 10 and levels_off(jobs[(20.0, 1.0)], "plain_no_cfg") > 10
    reused = [json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()]
    assert sorted(reused) == [0, 1, 1, 1]
    # two blocks by pattern (one the last, whose text is not updated), the adaptive scale
    case = settings("two_blocks_adaptive")
    layers = ",".join(case["layers"])
    result = run_cli(*model, *RUN, "guider=pag", f"guider.layers=[{layers}]", f"guider.scale={case['pag_scale']}",
                     f"guider.adaptive_scale={case['pag_adaptive_scale']}",
                     f"sampling.guidance_scale={case['guidance_scale']}", "hydra.run.dir=two", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert levels_off(tmp_path / "two", "two_blocks_adaptive") <= TOLERANCE
    assert levels_off(tmp_path / "two", "blocks_1") > 10
    assert "; guider pag (scale 30, adaptive_scale 0.02) on blocks.0, transformer_blocks.2" in result.stdout


@pytest.mark.slow
def test_pag_at_scale_zero_is_plain_cfg_bit_for_bit_on_an_sd35_model_and_from_png_remakes_it(tmp_path, cache_dir):
    """SD 3.5's shape (q/k norms, Medium's image-only attn2 in the picked block): PAG's scale 0 gives the images of
    guider=cfg exactly, the perturbed chunk's predictions weighted by zero; a PAG image's PNG remakes it."""
    quiet = ["+experiment=sd3_smoke", "tracking=none", "metrics.clip_score.enabled=false",
             f"paths.cache_dir={cache_dir}", "parallelism.num_devices=2"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, "guider=pag", "guider.layers=[blocks.0]", "guider.scale=0,3",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plain = run_cli(*quiet, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    hashes = {job.name: [r["pixels_sha256"] for r in json.loads((job / "images.json").read_text())]
              for job in (sweep / "0", sweep / "1", tmp_path / "plain")}
    assert hashes["0"] == hashes["plain"] and hashes["1"] != hashes["plain"]
    flops = [json.loads((job / "timings.json").read_text())["flops_per_batch"] for job in (sweep / "0", tmp_path / "plain")]
    assert flops[0] > 1.3 * flops[1]  # the third chunk counted (each step 1.5 calls' worth of the transformer)
    # the A1111 line carries the guider, its settings and layers: from_png remakes the image bit for bit
    record = json.loads((sweep / "1" / "images.json").read_text())[0]
    png = sweep / "1" / record["file"]
    remade = run_cli(str(png), "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
                     "prompts.max_sequence_length=16", "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    assert remade.returncode == 0, remade.stderr[-3000:]
    again = json.loads((tmp_path / "from_png" / "images.json").read_text())[0]
    assert (again["guider"], again["guider_layers"]) == ("pag", ["blocks.0"])
    assert again["pixels_sha256"] == record["pixels_sha256"]


def test_sd3_layers_that_pick_none_of_its_attention_are_one_line_naming_its_blocks(tmp_path, cache_dir):
    result = run_cli("+experiment=sd3_smoke", "tracking=none", "guider=pag", "guider.layers=[mid]",
                     f"paths.cache_dir={cache_dir}", "hydra.run.dir=run", cwd=tmp_path)
    assert_one_line_error(result, "error: guider.layers: 'mid' picks none of tiny-random-sd3's self-attention layers "
                                  "(allowed: patterns of their names: transformer_blocks.0, transformer_blocks.1, "
                                  "transformer_blocks.2 (transformer_blocks.1.attn, ...))")
    assert not (tmp_path / "run" / "images").exists()


def test_the_self_attention_names_are_diffusers_pag_targets():
    """The names the layers are matched against are the modules diffusers' PAG pipelines would pick from: each
    block's joint attn, and attn2 where SD 3.5 Medium's block has one."""
    import jax

    from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer, self_attention_names
    from sdjax_runner.models.nn.perturbed import perturbs

    config = json.loads((FIXTURES / "sd3" / "transformer-medium" / "config.json").read_text())
    module = FlaxSD3Transformer.from_config(config)
    shapes = jax.eval_shape(module.init_weights, jax.random.PRNGKey(0))
    names = self_attention_names(shapes)
    assert sorted(names) == ["transformer_blocks.0.attn", "transformer_blocks.0.attn2", "transformer_blocks.1.attn",
                             "transformer_blocks.1.attn2", "transformer_blocks.2.attn"]
    assert [n for n in names if perturbs(["blocks.1"], n)] == ["transformer_blocks.1.attn", "transformer_blocks.1.attn2"]
    assert [n for n in names if perturbs([r"blocks\.\d\.attn$"], n)] == [
        "transformer_blocks.0.attn", "transformer_blocks.1.attn", "transformer_blocks.2.attn"]


SEG = np.load(FIXTURES / "seg_sd3" / "seg.npz")


@pytest.mark.slow
def test_seg_on_sd3_is_the_published_blur_in_diffusers_sd3_pag_pipeline_from_one_program(tmp_path):
    """Smoothed-energy guidance (``guider=seg``) on SD 3: the perturbed chunk's image queries blurred (before the q
    norm, where diffusers' SEG hook blurs ``to_q``), against SEG's processor in diffusers' SD 3 PAG pipeline
    (tests/fixtures/seg_sd3) at 64 x 64 (4 x 4 patches): the infinite blur, a Gaussian, and guidance and scale 0 from
    one program; other layers without classifier-free guidance."""
    folder = sd3_medium_folder(tmp_path / "tiny-sd3-medium")
    run = [*RUN, "model=local", f"model.pretrained_model_name_or_path={folder}", "sampling.height=64",
           "sampling.width=64", "guider=seg"]
    cases = {case: json.loads(str(SEG[f"{case}_settings"])) for case in ("infinite", "sigma_half", "no_cfg")}
    assert cases["infinite"]["layers"] == cases["sigma_half"]["layers"] == ["blocks.1"]  # the family's default
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *run, f"guider.scale={cases['infinite']['seg_scale']},0",
                     f"guider.blur_sigma={cases['infinite']['seg_blur_sigma']},{cases['sigma_half']['seg_blur_sigma']}",
                     f"sampling.guidance_scale={cases['infinite']['guidance_scale']},1", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {}
    for job in sweep.glob("[0-9]"):
        record = json.loads((job / "images.json").read_text())[0]
        point = dict(item.split("=") for item in record["guider_settings"].split())
        jobs[(float(point["scale"]), float(point["blur_sigma"]), record["guidance_scale"])] = job
    assert len(jobs) == 8
    infinite, half = cases["infinite"]["seg_blur_sigma"], cases["sigma_half"]["seg_blur_sigma"]
    expected = {(20.0, infinite, 5.0): "infinite", (20.0, half, 5.0): "sigma_half", (0.0, infinite, 5.0): "plain",
                (0.0, half, 5.0): "plain", (0.0, infinite, 1.0): "plain_no_cfg"}
    for point, case in expected.items():
        assert levels_off(jobs[point], case, SEG) <= TOLERANCE, (point, case)
    assert levels_off(jobs[(20.0, infinite, 5.0)], "plain", SEG) > 10
    assert levels_off(jobs[(20.0, half, 5.0)], "infinite", SEG) > TOLERANCE  # the blurs told apart
    reused = [json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()]
    assert sorted(reused) == [0] + [1] * 7  # the scale, the blur and the guidance traced
    case = cases["no_cfg"]
    result = run_cli(*run, f"guider.layers=[{','.join(case['layers'])}]", f"guider.scale={case['seg_scale']}",
                     f"guider.blur_sigma={case['seg_blur_sigma']}", f"sampling.guidance_scale={case['guidance_scale']}",
                     "hydra.run.dir=no_cfg", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert levels_off(tmp_path / "no_cfg", "no_cfg", SEG) <= TOLERANCE
    assert levels_off(tmp_path / "no_cfg", "plain_no_cfg", SEG) > 10
