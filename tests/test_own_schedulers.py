"""The runner's own schedulers (sdjax_runner/families/sd/models/schedulers, issue #60) against the ones it ran before them:
diffusers 0.39's FlaxPNDMScheduler and FlaxDPMSolverMultistepScheduler, and tests/helpers/traced_schedulers.py's
DDIM, DDPM, Euler, LMS and LCM (the runner's former subclasses of diffusers' Flax ones, which keep diffusers' code
where they do not replace it; DDIM's and Euler's kept paths also against diffusers' own classes), bit for bit
(np.array_equal, float32, CPU: the guide-parity test compares images pixel for pixel). On the published SD 1.5
(PNDM), SD 2.1 (DDIM, v-prediction) and SDXL (Euler, leading) scheduler configs, each loaded into every scheduler as
the runner loads a model's config into the one a run selects: the states and timesteps for many step counts, whole
sampling loops under jax.jit inside jax.lax.fori_loop as engine/samplers/schedulers.py runs them (epsilon and
v-prediction, on a fixed stand-in model; from step 0 and part-way down), add_noise, and the zero-terminal-SNR
state. Every comparison is exact. (DPM-Solver's dynamic thresholding fails in diffusers' Flax scheduler: ours is
its PyTorch one's, checked against a NumPy transcription.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

PUBLISHED = json.loads((Path(__file__).parent / "helpers" / "published_configs.json").read_text())
CONFIGS = {kind: PUBLISHED[kind]["scheduler/scheduler_config.json"] for kind in ("sd15", "sd21", "sdxl")}
NAMES = ("pndm", "ddim", "lms", "dpm_solver_pp", "euler", "ddpm", "lcm")
SHAPE = (2, 4, 8, 8)
STEP_COUNTS = (1, 2, 7, 25, 50, 51)


def ours(name: str):
    from sdjax_runner.families.sd.models import schedulers

    return {"pndm": schedulers.PNDMScheduler, "ddim": schedulers.DDIMScheduler, "lms": schedulers.LMSDiscreteScheduler,
            "dpm_solver_pp": schedulers.DPMSolverMultistepScheduler, "euler": schedulers.EulerDiscreteScheduler,
            "ddpm": schedulers.DDPMScheduler, "lcm": schedulers.LCMScheduler}[name]


def reference(name: str):
    """The class the runner ran for ``name`` before its own (diffusers 0.39's Flax PNDM and DPM-Solver; the rest
    tests/helpers/traced_schedulers.py, the runner's former subclasses of diffusers' Flax schedulers)."""
    import diffusers

    import helpers.traced_schedulers as traced

    return {"pndm": diffusers.FlaxPNDMScheduler, "ddim": traced.DDIMScheduler, "lms": traced.LMSScheduler,
            "dpm_solver_pp": diffusers.FlaxDPMSolverMultistepScheduler, "euler": traced.EulerScheduler,
            "ddpm": traced.DDPMScheduler, "lcm": traced.LCMScheduler}[name]


def pair(name: str, config: dict, **overrides) -> tuple[Any, Any]:
    """(ours, the reference), each from ``config`` with ``overrides``, as models/schedulers.build_scheduler builds
    them (diffusers' DDIM takes no timestep_spacing: the runner registers it)."""
    mine = ours(name).from_config(config, **overrides)
    spacing = overrides.pop("timestep_spacing", config.get("timestep_spacing")) if name == "ddim" else None
    ref = reference(name).from_config(config, **overrides)
    if spacing is not None:
        ref.register_to_config(timestep_spacing=spacing)
    return mine, ref


def fields(state) -> dict:
    """A state's leaves by dotted field name."""
    import dataclasses

    out = {}
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{field.name}.{k}": v for k, v in fields(value).items()})
        else:
            out[field.name] = value
    return out


def assert_same(got, expected, what: str) -> None:
    """Bit for bit: same dtype, shape and values (NaNs where the other has them)."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape, expected.dtype,
                                                                         expected.shape)
    if not np.array_equal(got, expected, equal_nan=np.issubdtype(got.dtype, np.floating)):
        scale = max(float(np.max(np.abs(expected))), 1e-30)
        raise AssertionError(f"{what}: not bit for bit; max difference {np.max(np.abs(got - expected)) / scale:.3g} "
                             "relative")


def assert_same_state(got, expected, what: str) -> None:
    """The same fields (the engine reads ``hasattr(state, "sigmas")``), each bit for bit."""
    got_fields, expected_fields = fields(got), fields(expected)
    assert list(got_fields) == list(expected_fields), what
    for key, value in expected_fields.items():
        if value is None or isinstance(value, int):
            assert got_fields[key] == value, (what, key)
        else:
            assert_same(got_fields[key], value, f"{what}: {key}")


RNG = np.random.default_rng(60)
LATENTS = RNG.standard_normal(SHAPE).astype(np.float32)
FIELD = RNG.standard_normal(SHAPE).astype(np.float32)
DRAWS = RNG.standard_normal((60, *SHAPE)).astype(np.float32)


def stand_in(sample, t):
    """A stand-in for the guided UNet: a fixed function of the sample and the timestep (random-looking output)."""
    import jax.numpy as jnp

    t = t.astype(jnp.float32)
    return jnp.sin(1.3 * sample + 0.01 * t) * 0.7 + jnp.asarray(FIELD) * jnp.cos(t / 97.0)


def sample_loop(scheduler, steps: int, start: int = 0, eta: float = 0.0):
    """engine/samplers/schedulers.denoise's loop on the stand-in: set_timesteps on the state passed in, the noise
    times init_noise_sigma, then from step ``start`` in jax.lax.fori_loop: t from the timesteps (int32),
    scale_model_input, step (with ``eta``: the engine's DDIM step and the step's draw). (latents, final state)."""
    import jax
    import jax.numpy as jnp

    from sdjax_runner.engine.samplers.schedulers import ddim_step

    def run(state, latents):
        state = scheduler.set_timesteps(state, num_inference_steps=steps, shape=latents.shape)
        latents = latents * state.init_noise_sigma

        def body(index, carry):
            latents, state = carry
            t = jnp.array(state.timesteps, dtype=jnp.int32)[index]
            output = stand_in(scheduler.scale_model_input(state, latents, t), t)
            if eta:
                return ddim_step(scheduler, state, output, t, latents, eta, jnp.asarray(DRAWS)[index])
            return scheduler.step(state, output, t, latents).to_tuple()

        return jax.lax.fori_loop(start, steps, body, (latents, state))

    return run


def both_loops(mine, ref, steps: int, start: int = 0, eta: float = 0.0, states=None):
    """((latents, state) of ours, of the reference): each scheduler's :func:`sample_loop` under one jax.jit (one
    compilation for the two: the file's time is mostly compiling), on ``states`` (default: their new states)."""
    import jax
    import jax.numpy as jnp

    ours_loop, reference_loop = sample_loop(mine, steps, start, eta), sample_loop(ref, steps, start, eta)
    states = states or (mine.create_state(), ref.create_state())
    latents = jnp.asarray(LATENTS)
    return jax.jit(lambda a, b, x: (ours_loop(a, x), reference_loop(b, x)))(*states, latents)


def assert_same_loop(name: str, config: dict, steps: int, start: int = 0, eta: float = 0.0, **overrides) -> None:
    (got, got_state), (expected, expected_state) = both_loops(*pair(name, config, **overrides), steps, start, eta)
    what = f"{name} {overrides} {steps} steps from {start}"
    assert np.all(np.isfinite(np.asarray(expected))), what
    assert_same(got, expected, what)
    assert_same_state(got_state, expected_state, what)


# --- the states, timesteps and config --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_states_and_timesteps_are_the_runners_for_every_step_count(name):
    """create_state, and set_timesteps for each step count: under jax.jit, as the engine sets them (on the state
    passed in), and for one count eagerly, as the refiner's switch reads them (engine/refiner.py). (On SD 2.1's
    config, which differs from SD 1.5's in the prediction type only, create_state.)"""
    import jax

    counts = [n for n in STEP_COUNTS if name != "lcm" or n <= 50]
    for kind, config in CONFIGS.items():
        mine, ref = pair(name, config)
        state, expected = mine.create_state(), ref.create_state()
        assert_same_state(state, expected, f"{name} {kind}: create_state")
        if kind == "sd21":
            continue
        got, want = jax.jit(lambda a, b, mine=mine, ref=ref: ([mine.set_timesteps(a, n, SHAPE) for n in counts],
                                                             [ref.set_timesteps(b, n, SHAPE) for n in counts]))(
            state, expected)
        for steps, one, other in zip(counts, got, want, strict=True):
            assert_same_state(one, other, f"{name} {kind}: {steps} steps")
        if kind == "sd15":
            assert_same_state(mine.set_timesteps(state, 25, SHAPE), ref.set_timesteps(expected, 25, SHAPE),
                              f"{name} {kind}: 25 steps, eagerly")
    if name == "lcm":  # more than its 50 distillation steps: refused, as diffusers refuses
        with pytest.raises(ValueError, match="LCM takes"):
            mine.set_timesteps(state, 51, SHAPE)


def test_the_configs_read_as_the_runners():
    from sdjax_runner.engine.samplers.sigmas import training_sigmas

    for name in NAMES:
        for kind, config in CONFIGS.items():
            mine, ref = pair(name, config)
            assert mine.config["_class_name"] == type(mine).__name__
            for key, value in mine.config.items():
                if key in ref.config and not key.startswith("_"):
                    assert value == ref.config[key], (name, kind, key)
                    assert getattr(mine.config, key) == value
            assert not any(k.startswith("_") and k != "_class_name" for k in mine.config)
            assert mine.config.get("rescale_betas_zero_snr", False) is False
            np.testing.assert_array_equal(training_sigmas(mine.config), training_sigmas(ref.config))
            assert len(mine) == len(ref) == 1000


def test_every_beta_schedule_is_diffusers():
    from diffusers import FlaxDDPMScheduler
    from diffusers.schedulers.scheduling_utils_flax import CommonSchedulerState

    from sdjax_runner.families.sd.models.schedulers import CommonState

    for settings in ({"beta_schedule": "linear"}, {"beta_schedule": "scaled_linear", "beta_start": 0.00085,
                                                   "beta_end": 0.012}, {"beta_schedule": "squaredcos_cap_v2"},
                     {"trained_betas": list(np.linspace(1e-4, 0.03, 50)), "num_train_timesteps": 50}):
        got = CommonState.create(ours("ddpm")(**settings))
        assert_same_state(got, CommonSchedulerState.create(FlaxDDPMScheduler(**settings)), str(settings))
    with pytest.raises(ValueError, match="beta_schedule"):
        ours("ddpm")(beta_schedule="sigmoid").create_state()


def test_settings_overrides_and_bookkeeping():
    from sdjax_runner.families.sd.models.schedulers import SCHEDULER_CLASSES, DDIMScheduler, EulerDiscreteScheduler

    scheduler = EulerDiscreteScheduler.from_config(CONFIGS["sdxl"], prediction_type="v_prediction")
    assert scheduler.config.prediction_type == "v_prediction" and scheduler.config.timestep_spacing == "leading"
    assert "use_karras_sigmas" not in scheduler.config  # a PyTorch scheduler's setting: ignored, as diffusers' Flax
    scheduler.register_to_config(timestep_spacing="trailing")
    assert scheduler.config["timestep_spacing"] == "trailing"
    with pytest.raises(TypeError, match="use_karras_sigmas"):
        EulerDiscreteScheduler(use_karras_sigmas=True)
    with pytest.raises(AttributeError):
        _ = scheduler.config.no_such_setting
    assert DDIMScheduler().config.clip_sample is True  # diffusers' Flax defaults
    for class_name in ("PNDMScheduler", "FlaxPNDMScheduler", "DDIMScheduler", "LCMScheduler", "EulerDiscreteScheduler",
                       "FlaxLMSDiscreteScheduler", "DPMSolverMultistepScheduler", "DDPMScheduler"):
        assert SCHEDULER_CLASSES[class_name].__name__ == class_name.removeprefix("Flax")


def test_the_package_imports_no_diffusers_and_pickles():
    import pickle
    import subprocess
    import sys

    code = ("import sys, sdjax_runner.families.sd.models.schedulers; "
            "print(sorted(m for m in ('diffusers', 'torch', 'scipy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    mine = ours("ddim").from_config(CONFIGS["sd21"])
    copied = pickle.loads(pickle.dumps(mine))
    assert copied.config == mine.config and copied.config.prediction_type == "v_prediction"
    assert_same_state(pickle.loads(pickle.dumps(mine.create_state())), mine.create_state(), "pickled state")


def test_from_a_model_folder_as_the_registry_builds_it(tmp_path):
    from sdjax_runner.models.schedulers import build_scheduler

    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(CONFIGS["sd21"]))
    for name, overrides in (("ddim", {"timestep_spacing": "trailing"}), ("pndm", {}), ("euler", {"steps_offset": 0}),
                            ("dpm_solver_pp", {"solver_order": 3})):
        # the former registry's way: diffusers' config loading, DDIM's spacing registered after it
        spacing = overrides.get("timestep_spacing") if name == "ddim" else None
        ref = reference(name).from_config(CONFIGS["sd21"], **{k: v for k, v in overrides.items()
                                                                if spacing is None or k != "timestep_spacing"})
        if spacing is not None:
            ref.register_to_config(timestep_spacing=spacing)
        expected = ref.create_state()
        cls = ours(name)
        mine, state = cls.from_pretrained(tmp_path, subfolder="scheduler", **overrides)
        assert_same_state(build_scheduler(name, dict(overrides), str(tmp_path))[1], expected, name)
        assert cls.load_config(tmp_path, subfolder="scheduler") == CONFIGS["sd21"]
        assert_same_state(state, expected, name)
        assert_same_state(mine.set_timesteps(state, 9, SHAPE), ref.set_timesteps(expected, 9, SHAPE), name)
    saved = tmp_path / "saved"
    mine.save_pretrained(saved)
    assert ours("dpm_solver_pp").from_pretrained(saved)[0].config == mine.config


def test_dynamic_thresholding_is_diffusers_pytorch():
    """diffusers' PyTorch DPMSolverMultistepScheduler._threshold_sample, in NumPy (its Flax one fails there)."""
    import jax.numpy as jnp

    from sdjax_runner.families.sd.models.schedulers.dpm_solver import dynamic_threshold

    x0 = LATENTS * np.float32(3)
    for ratio, max_value in ((0.995, 1.0), (0.9, 2.5), (0.5, 1.0)):
        flat = x0.reshape(SHAPE[0], -1)
        s = np.clip(np.quantile(np.abs(flat), ratio, axis=1), 1, max_value)[:, None]
        expected = (np.clip(flat, -s, s) / s).reshape(SHAPE)
        np.testing.assert_allclose(np.asarray(dynamic_threshold(jnp.asarray(x0), ratio, max_value)), expected,
                                   rtol=1e-6, atol=1e-7)
    mine = ours("dpm_solver_pp").from_config(CONFIGS["sd15"], thresholding=True, prediction_type="sample",
                                             sample_max_value=2.0)
    state = mine.set_timesteps(mine.create_state(), 5, SHAPE)
    got = mine.convert_model_output(state, jnp.asarray(x0), state.timesteps[0], jnp.asarray(LATENTS))
    assert_same(got, dynamic_threshold(jnp.asarray(x0), 0.995, 2.0), "thresholded x0")


def test_add_noise_is_the_runners():
    import jax.numpy as jnp

    noise = jnp.asarray(RNG.standard_normal(SHAPE).astype(np.float32))
    timesteps = jnp.asarray([999, 3], jnp.int32)
    for name in NAMES:
        for kind, config in CONFIGS.items():
            mine, ref = pair(name, config)
            got = mine.add_noise(mine.create_state(), jnp.asarray(LATENTS), noise, timesteps)
            expected = ref.add_noise(ref.create_state(), jnp.asarray(LATENTS), noise, timesteps)
            assert_same(got, expected, f"{name} {kind}")
            if name in ("ddim", "ddpm"):
                assert_same(mine.get_velocity(mine.create_state(), jnp.asarray(LATENTS), noise, timesteps),
                            ref.get_velocity(ref.create_state(), jnp.asarray(LATENTS), noise, timesteps), name)


# --- sampling loops ---------------------------------------------------------------------------------------------


# (published config, prediction type, steps): SD 1.5's (epsilon) and SD 2.1's (v-prediction), linspace or leading
# by the scheduler's default; SDXL's (leading spacing, steps_offset) with each prediction type.
LOOPS = [("sd15", None, 25), ("sd21", None, 7), ("sdxl", "epsilon", 1), ("sdxl", "v_prediction", 2)]


def loop_cases():
    """Every scheduler on every row of LOOPS; slow: SDXL's config with v-prediction (SD 2.1's has it), and LMS's
    v-prediction (also the part-way loop's: LMS compiles slowest)."""
    for name in NAMES:
        for kind, prediction, steps in LOOPS:
            slow = (kind, prediction) == ("sdxl", "v_prediction") or (name, kind) == ("lms", "sd21")
            yield pytest.param(name, kind, prediction, steps, marks=[pytest.mark.slow] if slow else [],
                               id=f"{name}-{kind}-{prediction or 'published'}-{steps}")


@pytest.mark.parametrize("name,kind,prediction,steps", list(loop_cases()))
def test_a_jitted_sampling_loop_is_the_runners(name, kind, prediction, steps):
    assert_same_loop(name, CONFIGS[kind], steps, **({"prediction_type": prediction} if prediction else {}))


@pytest.mark.parametrize("name,steps,overrides", [
    ("pndm", 13, {"skip_prk_steps": False}),  # PRK's Runge-Kutta start
    ("pndm", 1, {"prediction_type": "v_prediction"}),
    ("ddim", 25, {"timestep_spacing": "trailing", "prediction_type": "v_prediction"}),
    ("ddim", 9, {"timestep_spacing": "linspace", "prediction_type": "sample", "clip_sample": True}),
    ("ddim", 50, {"set_alpha_to_one": True}),
    ("euler", 25, {"timestep_spacing": "trailing"}),
    ("euler", 51, {"timestep_spacing": "linspace", "prediction_type": "v_prediction"}),
    ("dpm_solver_pp", 10, {"solver_order": 3}),  # lower_order_final under 15 steps
    ("dpm_solver_pp", 20, {"solver_order": 3, "solver_type": "heun", "prediction_type": "v_prediction"}),
    ("dpm_solver_pp", 7, {"algorithm_type": "dpmsolver", "timestep_spacing": "trailing", "solver_type": "heun"}),
    pytest.param("dpm_solver_pp", 8, {"solver_order": 1, "timestep_spacing": "leading"}, marks=pytest.mark.slow),
    ("dpm_solver_pp", 5, {"prediction_type": "sample", "lower_order_final": False}),
    ("ddpm", 13, {"variance_type": "fixed_large", "clip_sample": True}),
    ("lcm", 4, {"prediction_type": "v_prediction"}),
    pytest.param("lms", 50, {}, marks=pytest.mark.slow),
])
def test_the_settings_a_run_may_override_step_as_the_runners(name, steps, overrides):
    assert_same_loop(name, CONFIGS["sd15"], steps, **overrides)


@pytest.mark.parametrize("name", ["pndm", "lms", "dpm_solver_pp"])
def test_a_loop_that_starts_part_way_down_is_the_runners(name):
    """Image to image: the loop from a later step (the multistep schedulers warm up from there), v-prediction."""
    assert_same_loop(name, CONFIGS["sd21"], 20, start=6)


def test_ddim_with_eta_through_the_engines_step_is_the_runners():
    assert_same_loop("ddim", CONFIGS["sd21"], 12, eta=0.6)


def test_diffusers_own_flax_ddim_and_euler_are_what_the_runner_subclasses_keep():
    """Where tests/helpers/traced_schedulers.py keeps diffusers' code (DDIM's leading spacing, Euler's linspace and
    leading), ours is diffusers' Flax scheduler itself."""
    import jax
    from diffusers import FlaxDDIMScheduler, FlaxEulerDiscreteScheduler

    counts = (1, 7, 50)
    for cls, theirs, kind in ((ours("ddim"), FlaxDDIMScheduler, "sd21"),
                              (ours("euler"), FlaxEulerDiscreteScheduler, "sdxl")):
        mine, ref = cls.from_config(CONFIGS[kind]), theirs.from_config(CONFIGS[kind])
        got, want = jax.jit(lambda a, b, mine=mine, ref=ref: (
            [mine.set_timesteps(a, n, SHAPE) for n in counts], [ref.set_timesteps(b, n, SHAPE) for n in counts]))(
            mine.create_state(), ref.create_state())
        for steps, one, other in zip(counts, got, want, strict=True):
            assert_same_state(one, other, f"{theirs.__name__} {kind} {steps}")
        (got, _), (expected, _) = both_loops(mine, ref, 9)
        assert_same(got, expected, theirs.__name__)


# --- zero terminal SNR ------------------------------------------------------------------------------------------


ZERO_SNR = ("ddim", "ddpm", "euler", "dpm_solver_pp")


def test_zero_terminal_snr_states_are_the_registrys(tmp_path):
    """The runner's former zero-terminal-SNR state (diffusers' CommonSchedulerState rescaled; Euler's and
    DPM-Solver's floored: tests/helpers/traced_schedulers.py), which ours makes itself from
    ``rescale_betas_zero_snr``, and which models/schedulers.build_scheduler gives from a model folder."""
    from helpers.traced_schedulers import ZERO_SNR_FLOORED, zero_terminal_snr_state
    from helpers.traced_schedulers import rescale_zero_terminal_snr as former
    from sdjax_runner.families.sd.models.schedulers import CommonState, rescale_zero_terminal_snr, zero_terminal_snr
    from sdjax_runner.models.schedulers import build_scheduler

    betas = np.linspace(0.00085**0.5, 0.012**0.5, 1000) ** 2
    assert_same(rescale_zero_terminal_snr(betas), former(betas), "rescale_zero_terminal_snr")
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(CONFIGS["sd15"]))
    for name in ZERO_SNR:
        ref = reference(name).from_config(CONFIGS["sd15"])
        expected = ref.create_state(zero_terminal_snr_state(ref, floored=name in ZERO_SNR_FLOORED))
        built, built_state = build_scheduler(name, {"rescale_betas_zero_snr": True}, str(tmp_path))
        assert_same_state(built_state, expected, name)
        mine = ours(name).from_config(CONFIGS["sd15"], rescale_betas_zero_snr=True)
        assert_same_state(mine.create_state(), expected, name)
        assert mine.config["rescale_betas_zero_snr"] is built.config["rescale_betas_zero_snr"] is True
        last = float(mine.create_state().common.alphas_cumprod[-1])
        assert last == (2.0**-24 if name in ZERO_SNR_FLOORED else 0.0)
        # the registry's way: a rescaled common state passed in
        plain = ours(name).from_config(CONFIGS["sd15"]).create_state().common
        rescaled = zero_terminal_snr(plain, floored=name in ZERO_SNR_FLOORED)
        assert isinstance(rescaled, CommonState)
        assert_same_state(mine.create_state(rescaled), expected, name)


@pytest.mark.parametrize("name", ZERO_SNR)
def test_a_zero_terminal_snr_loop_is_the_runners(name):
    """The zero-SNR recipe (trailing timesteps, v-prediction), from 999 where alphas_cumprod is 0 (or 2**-24)."""
    from helpers.traced_schedulers import ZERO_SNR_FLOORED, zero_terminal_snr_state

    overrides = {"prediction_type": "v_prediction"}
    overrides.update({"timestep_spacing": "trailing"} if name in ("ddim", "euler", "dpm_solver_pp") else {})
    mine, ref = pair(name, CONFIGS["sd15"], **overrides)
    mine.register_to_config(rescale_betas_zero_snr=True)
    ref.register_to_config(rescale_betas_zero_snr=True)
    expected_state = ref.create_state(zero_terminal_snr_state(ref, floored=name in ZERO_SNR_FLOORED))
    (got, got_state), (expected, expected_state) = both_loops(mine, ref, 8, states=(mine.create_state(),
                                                                                    expected_state))
    assert np.all(np.isfinite(np.asarray(expected))), name
    assert_same(got, expected, name)
    assert_same_state(got_state, expected_state, name)
