"""The guiders that work inside the SD family's UNet (issue #62 item 1): perturbed-attention guidance (``guider=pag``)
and FreeU (``guider=freeu``).

Against diffusers' own PyTorch pipelines (0.39) on the tiny SDXL base of tests/fixtures/refiner from the runner's
initial latents (tests/helpers/make_unet_guiders_reference.py): ``StableDiffusionXLPAGPipeline`` (tests/fixtures/pag)
on the default ``mid`` layers, other layers with the adaptive scale, and without classifier-free guidance;
``StableDiffusionXLPipeline`` with ``enable_freeu`` (tests/fixtures/freeu) at FreeU's published SDXL and SD 1.5
factors. Through the command line: a sweep over the scales compiles once, PAG's scale
0 and FreeU's factors 1 are plain CFG's images bit for bit, on a diffusers scheduler and a k sampler; the records and
the PNG name the guider, its settings and its layers, and from_png remakes the images; what they cannot run with is
one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import ONE_DEVICE, assert_one_line_error, call_cli, run_cli
from helpers.images import images_of

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = np.load(FIXTURES / "pag" / "pag.npz")
BASE = FIXTURES / "refiner" / "tiny-sdxl-base"
# The reference's settings: the folder's Euler scheduler, 6 steps, 32 x 32, seed 0 on 2 devices (its latents are the
# runner's), its prompt.
SDXL = ["model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={BASE}", "scheduler=euler",
        f"sampling.num_inference_steps={int(REFERENCE['steps'])}", "sampling.height=32", "sampling.width=32", "seed=0",
        f"prompts.texts=[{REFERENCE['prompt']}]", "parallelism.num_devices=2", "tracking=none",
        "metrics.clip_score.enabled=false"]


FREEU = np.load(FIXTURES / "freeu" / "freeu.npz")
SEG = np.load(FIXTURES / "seg" / "seg.npz")


def levels_off(run_dir: Path, case: str, reference=REFERENCE) -> float:
    """The largest difference, in 8-bit levels, from the reference's float images made 8-bit."""
    got = np.stack(images_of(run_dir)).astype(np.float64)
    return float(np.abs(got - np.round(reference[case] * 255)).max())


def pixels(run_dir: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p), dtype=np.int16) for p in sorted((run_dir / "images").glob("*.png"))])


def hashes(run_dir: Path) -> list[str]:
    return [r["pixels_sha256"] for r in json.loads((run_dir / "images.json").read_text())]


@pytest.mark.slow
def test_pag_is_diffusers_sdxl_pag_pipeline_on_its_layers_with_and_without_cfg(tmp_path):
    for case in ("mid", "layers_adaptive", "no_cfg"):
        settings = json.loads(str(REFERENCE[f"{case}_settings"]))
        layers = ",".join(f"'{layer}'" for layer in settings["layers"])
        result = run_cli(*SDXL, "guider=pag", f"sampling.guidance_scale={settings['guidance_scale']}",
                         f"guider.scale={settings['pag_scale']}", f"guider.adaptive_scale={settings['pag_adaptive_scale']}",
                         f"guider.layers=[{layers}]", f"hydra.run.dir={tmp_path / case}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert levels_off(tmp_path / case, case) <= 1, case  # within one 8-bit level (float32 on both sides)
    # the check tells PAG from plain CFG, and the layers apart
    plain = run_cli(*SDXL, "sampling.guidance_scale=5", f"hydra.run.dir={tmp_path / 'plain'}", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert levels_off(tmp_path / "plain", "mid") > 1 and levels_off(tmp_path / "layers_adaptive", "mid") > 1


@pytest.mark.slow
def test_freeu_is_diffusers_enable_freeu_at_its_published_factors_from_one_program(tmp_path):
    sdxl = [*SDXL, "sampling.height=64", "sampling.width=64", f"sampling.guidance_scale={float(FREEU['guidance_scale'])}"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *sdxl, "guider=freeu", "guider.b1=1.3,1.5", "guider.b2=1.4,1.6", "guider.s1=0.9",
                     "guider.s2=0.2", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {tuple(json.loads((job / "images.json").read_text())[0]["guider_settings"].split()): job
            for job in sweep.glob("[0-9]")}
    published = {"sdxl": ("b1=1.3", "b2=1.4", "s1=0.9", "s2=0.2"), "sd15": ("b1=1.5", "b2=1.6", "s1=0.9", "s2=0.2")}
    for case, settings in published.items():
        assert levels_off(jobs[settings], case, FREEU) <= 1, case  # within one 8-bit level of diffusers'
        assert levels_off(jobs[settings], "plain", FREEU) > 1
    assert sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()) == \
        [0, 1, 1, 1]  # the factors are traced: one program
    plain = run_cli(*sdxl, f"hydra.run.dir={tmp_path / 'plain'}", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert levels_off(tmp_path / "plain", "plain", FREEU) <= 1


@pytest.mark.slow
def test_a_pag_scale_sweep_compiles_once_its_zero_and_freeus_ones_are_plain_cfg_and_from_png_remakes_it(tmp_path, cache_dir):
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", *ONE_DEVICE,
             "compilation_cache.executables=false", f"paths.cache_dir={cache_dir}"]
    for name, sampler in (("pndm", []), ("euler_a", ["sampler=Euler a"])):  # the smoke's scheduler, a k sampler
        sweep, plain = tmp_path / f"{name}-sweep", tmp_path / f"{name}-plain"
        result = run_cli("-m", *quiet, *sampler, "guider=pag", "guider.scale=0,3",
                         "guider.layers=[mid,up_blocks.1]", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "; guider pag (scale 0, adaptive_scale 0) on mid, up_blocks.1" in result.stdout  # the plan line
        alone = run_cli(*quiet, *sampler, f"hydra.run.dir={plain}", cwd=tmp_path)
        assert alone.returncode == 0, alone.stderr[-3000:]
        assert hashes(sweep / "0") == hashes(plain)  # scale 0: classifier-free guidance's images, bit for bit
        assert np.abs(pixels(sweep / "1") - pixels(plain)).max() >= 2
        assert json.loads((sweep / "1" / "timings.json").read_text())["compile_reused"] == 1  # the scale is traced
        unchanged = tmp_path / f"{name}-freeu"  # FreeU at factors 1: the plain UNet, bit for bit
        result = run_cli(*quiet, *sampler, "guider=freeu", "guider.b1=1", "guider.b2=1", "guider.s1=1", "guider.s2=1",
                         f"hydra.run.dir={unchanged}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert hashes(unchanged) == hashes(plain)
    record = json.loads((sweep / "1" / "images.json").read_text())[0]
    assert (record["guider"], record["guider_settings"], record["guider_layers"]) == \
        ("pag", "scale=3 adaptive_scale=0", ["mid", "up_blocks.1"])
    png = sweep / "1" / record["file"]
    with Image.open(png) as image:
        assert ("Guider: pag, Guider scale: 3, Guider adaptive_scale: 0, Guider layers: \"mid, up_blocks.1\", "
                in image.text["parameters"])
    remade = run_cli(str(png), "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
                     *ONE_DEVICE, "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Guider: pag -> guider=pag" in said and "Guider layers: mid, up_blocks.1 -> guider.layers=" in said
    assert hashes(tmp_path / "from_png")[0] == record["pixels_sha256"]


def published_blur(images: np.ndarray, sigma: float) -> np.ndarray:
    """SEG-SDXL's ``gaussian_blur_2d`` and infinite blur (its ``SEGCFGSelfAttnProcessor``) in NumPy: ``images``
    (batch, channels, side, side); an odd ``ceil(6 sigma) + 1 - ceil(6 sigma) % 2`` taps, at most the side (+1 when
    even), of a normalized Gaussian, outer product on both axes, over the images reflect-padded by half the taps, each
    channel alone; over sigma 9999 each image's mean."""
    import math

    if sigma > 9999.0:
        return np.broadcast_to(images.mean(axis=(-2, -1), keepdims=True), images.shape)
    side = images.shape[-1]
    taps = min(math.ceil(6 * sigma) + 1 - math.ceil(6 * sigma) % 2, side - (side % 2 - 1))
    offsets = np.linspace(-(taps - 1) * 0.5, (taps - 1) * 0.5, taps)
    weights = np.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = np.outer(weights / weights.sum(), weights / weights.sum())
    pad = taps // 2
    padded = np.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="reflect")
    out = np.zeros_like(images)
    for i in range(taps):
        for j in range(taps):
            out += kernel[i, j] * padded[..., i:i + side, j:j + side]
    return out


@pytest.mark.parametrize("side", [2, 3, 4, 5, 8])
def test_segs_query_blur_is_the_published_gaussian_and_mean_for_a_traced_sigma(side):
    import jax

    from sdjax_runner.models.nn.perturbed import blurred_queries

    queries = np.random.default_rng(side).standard_normal((2, side * side, 6)).astype(np.float32)
    blur = jax.jit(lambda q, sigma: blurred_queries(q, side, side, sigma))  # one program for every sigma
    for sigma in (0.2, 0.3, 0.5, 1.0, 2.0, 50.0, 9999.0, 9999999.0):
        grid = queries.reshape(2, side, side, 6).transpose(0, 3, 1, 2)  # as the processor sees it: channels first
        expected = published_blur(grid, sigma).transpose(0, 2, 3, 1).reshape(queries.shape)
        np.testing.assert_allclose(np.asarray(blur(queries, np.float32(sigma))), expected, rtol=0, atol=2e-6)
    assert blur._cache_size() == 1


@pytest.mark.slow
def test_seg_is_the_published_seg_processor_in_diffusers_pag_pipeline_a_sweep_compiles_once_and_scale_0_is_cfg(tmp_path):
    """SEG against SEG-SDXL's processor (transcribed) in diffusers' PAG pipeline (tests/fixtures/seg): three blurs from
    one program, its scale 0 plain CFG's images bit for bit; other layers without CFG; the records and the PNG."""
    seg = [*SDXL, "sampling.height=64", "sampling.width=64", "guider=seg"]
    cases = {case: json.loads(str(SEG[f"{case}_settings"])) for case in ("infinite", "sigma_1", "sigma_half", "no_cfg")}
    swept = cases["infinite"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *seg, f"sampling.guidance_scale={swept['guidance_scale']}",
                     f"guider.layers=[{','.join(swept['layers'])}]", "guider.scale=0," + str(swept["seg_scale"]),
                     "guider.blur_sigma=" + ",".join(str(cases[c]["seg_blur_sigma"]) for c in ("infinite", "sigma_1",
                                                                                               "sigma_half")),
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {json.loads((job / "images.json").read_text())[0]["guider_settings"]: job for job in sweep.glob("[0-9]")}
    assert len(jobs) == 6
    # the records give each setting as it reads back (SEG's infinite 9999999 in full, not :g's 1e+07)
    for case, settings in (("infinite", "scale=8 blur_sigma=9999999"), ("sigma_1", "scale=8 blur_sigma=1"),
                           ("sigma_half", "scale=8 blur_sigma=0.5")):
        job = jobs[settings]
        assert levels_off(job, case, SEG) <= 1, case  # within one 8-bit level of the published processor's
        assert levels_off(job, "plain", SEG) > 1 and all(levels_off(job, other, SEG) > 1 for other in (
            "infinite", "sigma_1", "sigma_half") if other != case), case  # the check tells the blurs apart
    zeros = [job for settings, job in jobs.items() if settings.startswith("scale=0 ")]
    assert len({tuple(hashes(job)) for job in zeros}) == 1 and levels_off(zeros[0], "plain", SEG) <= 1
    assert sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()) == \
        [0, 1, 1, 1, 1, 1]  # the scale and the blur are traced: one program
    no_cfg = cases["no_cfg"]
    result = run_cli(*seg, f"sampling.guidance_scale={no_cfg['guidance_scale']}", f"guider.scale={no_cfg['seg_scale']}",
                     f"guider.blur_sigma={no_cfg['seg_blur_sigma']}", "guider.layers=[" + ",".join(no_cfg["layers"]) + "]",
                     f"hydra.run.dir={tmp_path / 'no_cfg'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; guider seg (scale 8, blur_sigma 2) on down_blocks.1, up_blocks.0.attentions.0" in result.stdout
    assert levels_off(tmp_path / "no_cfg", "no_cfg", SEG) <= 1 and levels_off(tmp_path / "no_cfg", "plain_no_cfg", SEG) > 1
    record = json.loads((tmp_path / "no_cfg" / "images.json").read_text())[0]
    assert (record["guider"], record["guider_settings"], record["guider_layers"]) == \
        ("seg", "scale=8 blur_sigma=2", ["down_blocks.1", "up_blocks.0.attentions.0"])
    with Image.open(tmp_path / "no_cfg" / record["file"]) as image:
        assert ("Guider: seg, Guider scale: 8, Guider blur_sigma: 2, Guider layers: \"down_blocks.1, "
                "up_blocks.0.attentions.0\"" in image.text["parameters"])


def test_seg_defaults_are_the_published_pipelines():
    from omegaconf import OmegaConf

    from helpers.configs import compose_cfg
    from sdjax_runner.config.families import FAMILIES
    from sdjax_runner.config.guiders import check

    guider = check(OmegaConf.to_object(compose_cfg(["+experiment=smoke", "guider=seg"])), FAMILIES["sd"])
    # SEG-SDXL's __call__: seg_scale 3.0, seg_blur_sigma 9999999.0 (infinite), seg_applied_layers ['mid']
    assert (guider.name, dict(guider.settings), guider.layers) == ("seg", {"scale": 3.0, "blur_sigma": 9999999.0},
                                                                   ("mid",))


def test_layers_pick_self_attention_modules_by_their_pytorch_names_and_diffusers_rule():
    import jax
    from safetensors.numpy import load_file

    from sdjax_runner.families.sd.models.unet import UNet2DConditionModel, perturbs, self_attention_names, torch_name

    assert torch_name(("down_blocks_1", "attentions_0", "transformer_blocks_1", "attn1")) == \
        "down_blocks.1.attentions.0.transformer_blocks.1.attn1"
    # the names of this UNet's self-attention modules are those of diffusers' PyTorch UNet on the same config
    pytorch: dict = {}
    for key in load_file(BASE / "unet" / "diffusion_pytorch_model.safetensors"):
        node = pytorch
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {})
    unet = UNet2DConditionModel.from_config(json.loads((BASE / "unet" / "config.json").read_text()))
    ours = jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0))
    names = self_attention_names(ours)
    assert sorted(names) == sorted(self_attention_names(pytorch)) and len(names) == 2 + 2 + 4
    assert [name for name in names if perturbs(["mid"], name)] == \
        [f"mid_block.attentions.0.transformer_blocks.{i}.attn1" for i in (0, 1)]
    assert {name.split(".")[0] for name in names if perturbs(["^(up|down)_blocks"], name)} == {"down_blocks", "up_blocks"}
    assert len([name for name in names if perturbs(["transformer_blocks.1"], name)]) == 4  # (every second layer)
    assert not any(perturbs(["attn2"], name) for name in names)  # cross-attention is never perturbed


REFINED = ["model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={BASE}",
           f"model.refiner={FIXTURES / 'refiner' / 'tiny-sdxl-refiner'}"]


@pytest.mark.parametrize(("guider", "overrides", "expected"), [
    ("pag", ["model=tiny-random-flux"], "error: guider: pag: tiny-random-flux is a flux model, which runs cfg, "
                                        "cfg_zero_star, apg"),
    ("pag", ["guider.layers=['(']"], "error: guider.layers: '(' is no regular expression"),
    ("pag", ["guider.layers=[]"], "error: guider.layers: no layers (allowed: patterns of the denoiser's self-attention"),
    ("pag", ["guider.layers=['a,b']"], "error: guider.layers: 'a,b' (allowed: patterns"),
    ("pag", ["guider.adaptive_scale=-1"], "error: guider.adaptive_scale: must be >= 0, got -1.0"),
    ("pag", ["guider.scale=nan"], "error: guider.scale: must be a finite number, got nan"),
    ("pag", REFINED, "error: guider: pag with model.refiner: it runs inside the base's UNet, not the refiner's, here"),
    ("seg", ["model=tiny-random-flux"], "error: guider: seg: tiny-random-flux is a flux model, which runs cfg, "
                                        "cfg_zero_star, apg"),
    ("seg", ["guider.blur_sigma=0"], "error: guider.blur_sigma: must be > 0, got 0.0 (allowed: a positive number: "
                                     "seg's blur"),
    ("seg", REFINED, "error: guider: seg with model.refiner: it runs inside the base's UNet, not the refiner's, here"),
    ("freeu", ["model=tiny-random-flux"], "error: guider: freeu: tiny-random-flux is a flux model, which runs cfg, "),
    ("freeu", ["model=tiny-random-sd3"], "error: guider: freeu: tiny-random-sd3 is a sd3 model, which runs cfg, "
                                         "cfg_zero_star, apg, pag, seg"),
    ("freeu", ["guider.b1=inf"], "error: guider.b1: must be a finite number, got inf (allowed: a number (FreeU's "
                                 "published"),
    ("freeu", REFINED, "error: guider: freeu with model.refiner: it runs inside the base's UNet, not the refiner's, "
                       "here"),
])
def test_what_pag_seg_and_freeu_cannot_run_with_is_one_line(tmp_path, guider, overrides, expected):
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", f"guider={guider}", *overrides, cwd=tmp_path),
                          expected)


@pytest.mark.slow
def test_layers_that_pick_none_of_the_models_are_one_line_naming_its_blocks(tmp_path, tiny_model_dir):
    result = run_cli("+experiment=smoke", "tracking=none", "guider=pag", "guider.layers=[mid,nowhere]", *ONE_DEVICE,
                     "hydra.run.dir=run", cwd=tmp_path)
    assert_one_line_error(result, "error: guider.layers: 'nowhere' picks none of tiny-random's self-attention layers "
                                  "(allowed: patterns of their names: ")
    assert not (tmp_path / "run" / "images").exists()
