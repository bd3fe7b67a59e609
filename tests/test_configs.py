"""Every config composes against the schema; typos fail at compose time."""

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from helpers.configs import CONF, compose_cfg
from sdjax_runner.config.guiders import GUIDERS
from sdjax_runner.config.messages import describe
from sdjax_runner.config.plan import admit, make_plan

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
GROUP_OPTIONS = sorted(
    (group.name, option.stem)
    for group in CONF.iterdir()
    if group.is_dir() and group.name not in ("experiment", "hydra")
    for option in group.glob("*.yaml")
) + [("guider", name) for name in GUIDERS]  # a group filled from its registry (config/guiders.py: register)


def test_the_config_tree_is_what_the_tests_cover():
    assert EXPERIMENTS == ["flux2_smoke", "flux_schnell", "flux_schnell_smoke", "flux_smoke", "guide_different_prompts",
                           "guide_same_prompt", "kontext_smoke", "sd3_smoke", "smoke"]
    assert ("model", "sd-v1-4") in GROUP_OPTIONS and ("tracking", "none") in GROUP_OPTIONS
    models = {option for group, option in GROUP_OPTIONS if group == "model"}
    assert models == {"local", "tiny-random", "tiny-random-inpaint", "tiny-random-xl", "sd-v1-arch", "sdxl-arch",
                      "sd-v1-4", "sd-v1-5", "sd-v1-5-inpainting", "sd-2-1-base", "sd-2-1", "sdxl-base-1.0",
                      "single_file", "tiny-random-flux", "tiny-random-flux-schnell", "flux-dev", "flux-schnell", "flux-dev-arch",
                      "flux-fill-dev", "flux-kontext-dev", "tiny-random-flux-kontext", "tiny-random-flux-fill", "tiny-random-sd3",
                      "flux-canny-dev", "flux-depth-dev", "tiny-random-flux-control",
                      "sd3.5-large", "sd3.5-large-turbo", "sd3.5-medium", "sd3.5-large-arch",
                      "tiny-random-flux2", "tiny-random-flux2-base", "flux2-klein-4b", "flux2-klein-9b",
                      "flux2-klein-base-4b", "flux2-klein-base-9b", "flux2-klein-4b-arch", "flux2-klein-9b-arch"}
    schedulers = {o for g, o in GROUP_OPTIONS if g == "scheduler"}
    assert schedulers == {"pndm", "ddim", "lms", "dpm_solver_pp", "euler", "ddpm", "lcm",  # diffusers'
                          "normal", "karras", "exponential", "sgm_uniform", "simple",  # the k samplers' sigma schedules
                          "flow_match_euler", "beta"}  # FLUX.1's own scheduler, ComfyUI's beta for its k samplers


@pytest.mark.parametrize("model,resolution,prediction", [
    ("sd-v1-4", 512, None), ("sd-v1-5", 512, None), ("sd-v1-5-inpainting", 512, None), ("sd-2-1-base", 512, "epsilon"), ("sd-2-1", 768, "v_prediction"),
    ("sdxl-base-1.0", 1024, None), ("sd-v1-arch", 512, None), ("sdxl-arch", 1024, None),
])
def test_model_configs_say_their_native_size_and_prediction_type(model, resolution, prediction):
    cfg = compose_cfg([f"model={model}"])
    assert cfg.model.resolution == resolution
    assert (cfg.model.prediction_type.name if cfg.model.prediction_type else None) == prediction
    assert cfg.model.allow_pickle is False


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_resolves_and_plans(name):
    cfg = compose_cfg([f"+experiment={name}"])
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert resolved["experiment"] == name
    # Validation needs no weights: the real-weight experiments plan without the hub.
    plan = make_plan(admit(cfg), available_devices=8)
    assert plan.num_devices == 8 and plan.images_per_batch == 8


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("model", "local"):
        overrides.append("model.pretrained_model_name_or_path=/some/dir")
    cfg = compose_cfg(overrides)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def test_guide_experiments_match_the_guide():
    same = compose_cfg(["+experiment=guide_same_prompt"])
    different = compose_cfg(["+experiment=guide_different_prompts"])
    for cfg in (same, different):
        assert cfg.model.pretrained_model_name_or_path == "CompVis/stable-diffusion-v1-4"
        assert cfg.model.variant == "bf16" and cfg.model.safety_checker is True
        assert cfg.dtype.weights_dtype.name == cfg.dtype.activations_dtype.name == "bfloat16"
        assert (cfg.sampling.num_inference_steps, cfg.sampling.height, cfg.sampling.width) == (50, 512, 512)
        assert cfg.scheduler.name == "pndm" and cfg.seed == 0
    plan = make_plan(admit(different), available_devices=8)
    assert [s.prompt for s in plan.images][:2] == ["Labrador in the style of Hokusai",
                                                  "Painting of a squirrel skating in New York"]
    assert len({s.prompt for s in plan.images}) == 8
    assert len({s.prompt for s in make_plan(admit(same), available_devices=8).images}) == 1


def test_smoke_is_small():
    cfg = compose_cfg(["+experiment=smoke"])
    assert cfg.model.builtin == "tiny-random" and cfg.dtype.name == "fp32"
    assert cfg.sampling.num_inference_steps <= 8 and cfg.sampling.height <= 128


@pytest.mark.parametrize("override,message", [
    ("sampling.num_inference_step=3", "sampling.num_inference_step: unknown key (allowed: num_inference_steps,"),
    ("seed=abc", "seed: Value 'abc'"),
    ("dtype.weights_dtype=int8", "expected one of [float32, bfloat16, float16]"),
    ("scheduler=nope", "scheduler=nope: no such option (allowed: beta, ddim, ddpm, dpm_solver_pp, euler, exponential, flow_match_euler, karras, "
                       "lcm, lms, normal, pndm, sgm_uniform, simple)"),
    ("model.prediction_type=x0", "model.prediction_type: Invalid value 'x0', expected one of [epsilon, v_prediction, sample]"),
])
def test_schema_rejects_bad_values_at_compose_time(override, message):
    with pytest.raises(ConfigCompositionException) as info:
        compose_cfg(["+experiment=smoke", override])
    line = describe(info.value)
    assert message in line and "\n" not in line


def test_users_own_experiments_outside_the_package_compose(tmp_path):
    from helpers.cli import run_cli

    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /scheduler: euler\nexperiment: mine\nrun_name: mine\nseed: 7\n")
    result = run_cli("--config-dir", str(tmp_path / "my_conf"), "+experiment=mine", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "experiment: mine" in result.stdout and "seed: 7" in result.stdout and "name: euler" in result.stdout


def test_no_packaged_config_sets_hydra_mode():
    """Hydra's mode of a command is read without composing where only the packaged configs are on the search path
    (internals.compose_once): that holds while no packaged YAML file sets ``hydra.mode`` (Hydra's own options, and
    the launchers' and sweepers' structured ones, set none)."""
    import yaml

    files = sorted(CONF.rglob("*.yaml"))
    assert len(files) > 50
    for path in files:  # (the files of the hydra/ groups are hydra.job_logging's and the like: no mode there)
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        assert "mode" not in (document.get("hydra") or {}) and "hydra.mode" not in document, path
