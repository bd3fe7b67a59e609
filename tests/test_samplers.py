"""The k-diffusion samplers and sigma schedules against references that are not ours, on a closed-form denoiser.

Data ~ N(mu, v) element-wise has the exact denoiser D(x, sigma) = (v x + sigma^2 mu) / (v + sigma^2), and its
probability-flow ODE the exact solution x(sigma) = mu + (x_T - mu) sqrt(v + sigma^2) / sqrt(v + sigma_T^2). So:
each JAX sampler is checked against a NumPy transcription of k-diffusion's published algorithm
(tests/helpers/k_reference.py) with the same noise draws; the deterministic ones converge to the exact
solution at their order; the stochastic ones end with the data's mean and variance. One CLI sweep runs the
samplers through the UNet as users name them.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from helpers import k_reference
from helpers.cli import ONE_DEVICE, assert_one_line_error, call_cli, run_cli
from sdjax_runner.config import samplers as names
from sdjax_runner.engine.samplers import sigmas as schedules
from sdjax_runner.engine.samplers.k_samplers import K_SAMPLERS, key_noise

SHAPE = (2, 4, 3, 3)
V = 0.25
RNG = np.random.default_rng(0)
MU = RNG.standard_normal(SHAPE) * 0.5
TRAINING = schedules.training_sigmas({})  # Stable Diffusion's: scaled_linear 0.00085..0.012, 1000 steps
# Orders toward the exact solution at sigma_min; UniPC's last move is first order (ComfyUI's), so 2 overall.
DETERMINISTIC = {"euler": 1, "heun": 2, "dpm_2": 2, "dpmpp_2m": 2, "lms": 2, "uni_pc": 2, "uni_pc_bh2": 2}


def denoiser(mu, v):
    return lambda x, sigma: (v * x + sigma**2 * mu) / (v + sigma**2)


def exact(x_start, sigma_max, sigma):
    """The probability-flow ODE's solution at ``sigma`` from ``x_start`` at ``sigma_max``."""
    return MU + (x_start - MU) * math.sqrt(V + sigma**2) / math.sqrt(V + sigma_max**2)


def run_jax(name, x, sigmas, noises=None, x64=True, **options):
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        draws = jnp.asarray(noises if noises is not None else np.zeros((len(sigmas), 2) + x.shape), dtype)
        # The sigmas are constants of the program, as in the runner's (LMS integrates on them on the host).
        program = jax.jit(lambda x: K_SAMPLERS[name](denoiser(jnp.asarray(MU, dtype), V), x, sigmas,
                                                     lambda i, j: draws[i, j], **options))
        return np.asarray(program(jnp.asarray(x, dtype)))


@pytest.mark.parametrize("name", sorted(K_SAMPLERS))
def test_each_sampler_is_k_diffusions_algorithm(name):
    sigmas = k_reference.schedule("karras", 12, TRAINING)
    noises = RNG.standard_normal((12, 2) + SHAPE)
    x = RNG.standard_normal(SHAPE) * sigmas[0]
    expected = k_reference.sample(name, denoiser(MU, V), x, sigmas, lambda i, j: noises[i, j])
    np.testing.assert_allclose(run_jax(name, x, sigmas, noises), expected, rtol=1e-10, atol=1e-10)
    # In float32, as the program runs it: the same to float32's precision.
    np.testing.assert_allclose(run_jax(name, x, sigmas, noises, x64=False), expected, rtol=2e-4, atol=2e-4)


def test_each_sampler_started_part_way_is_a_run_on_the_rest_of_the_schedule():
    """img2img/inpaint start at step s (a traced number, so a strength sweep compiles once): that must be
    k-diffusion's run on sigmas[s:] (A1111's and diffusers' img2img), step i still drawing step i's noise."""
    import jax
    import jax.numpy as jnp

    sigmas = k_reference.schedule("karras", 10, TRAINING)
    noises = RNG.standard_normal((10, 2) + SHAPE)
    x = RNG.standard_normal(SHAPE)
    with jax.enable_x64(True):
        draws = jnp.asarray(noises)
        for name in sorted(K_SAMPLERS):
            program = jax.jit(lambda x, start: K_SAMPLERS[name](denoiser(jnp.asarray(MU), V), x, sigmas,  # noqa: B023 -- traced and called in this iteration
                                                                lambda i, j: draws[i, j], start=start))
            for start in (3, 7):
                x_start = x * sigmas[start]
                expected = k_reference.sample(name, denoiser(MU, V), x_start, sigmas[start:],
                                              lambda i, j, start=start: noises[i + start, j])
                got = np.asarray(program(jnp.asarray(x_start), jnp.int32(start)))
                np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10, err_msg=f"{name} from step {start}")


@pytest.mark.parametrize("name", sorted(set(names.ETA) - {"ddim"}))
def test_eta_is_k_diffusions_eta(name):
    sigmas = k_reference.schedule("karras", 8, TRAINING)
    noises = RNG.standard_normal((8, 2) + SHAPE)
    x = RNG.standard_normal(SHAPE) * sigmas[0]
    for eta in (0.0, 0.5):
        expected = k_reference.sample(name, denoiser(MU, V), x, sigmas, lambda i, j: noises[i, j], eta=eta)
        np.testing.assert_allclose(run_jax(name, x, sigmas, noises, eta=eta), expected, rtol=1e-10, atol=1e-10)
    if name == "euler_ancestral":  # no noise: Euler itself
        np.testing.assert_allclose(run_jax(name, x, sigmas, noises, eta=0.0), run_jax("euler", x, sigmas), rtol=1e-12)


def test_ddim_with_eta_adds_the_noise_diffusers_flax_leaves_out():
    import jax.numpy as jnp
    from diffusers import FlaxDDIMScheduler

    from sdjax_runner.engine.samplers.schedulers import ddim_step

    scheduler = FlaxDDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                  set_alpha_to_one=False, steps_offset=1, clip_sample=False)
    state = scheduler.set_timesteps(scheduler.create_state(), num_inference_steps=10, shape=SHAPE)
    eps, x, z = (RNG.standard_normal(SHAPE).astype(np.float32) for _ in range(3))
    for index in (2, 9):  # a middle step, and the last (to the final alpha)
        t = int(state.timesteps[index])
        got, _ = ddim_step(scheduler, state, jnp.asarray(eps), jnp.asarray(t), jnp.asarray(x), 0.7, jnp.asarray(z))
        # DDIM (Song et al.) eq. 12 and 16, as diffusers' PyTorch DDIMScheduler.step computes it
        alphas = np.cumprod(1 - np.linspace(0.00085**0.5, 0.012**0.5, 1000) ** 2)
        prev = t - 100
        a_t, a_prev = alphas[t], alphas[prev] if prev >= 0 else alphas[0]
        x0 = (x - np.sqrt(1 - a_t) * eps) / np.sqrt(a_t)
        std = 0.7 * np.sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))
        expected = np.sqrt(a_prev) * x0 + np.sqrt(1 - a_prev - std**2) * eps + std * z
        np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", schedules.SCHEDULES)
def test_each_schedule_is_the_published_one(name):
    for steps in (1, 10, 25, 50):
        ours = schedules.schedule(name, steps, TRAINING)
        assert ours.shape == (steps + 1,) and ours[-1] == 0 and np.all(np.diff(ours) < 0)
        np.testing.assert_allclose(ours, k_reference.schedule(name, steps, TRAINING), rtol=1e-12)
    assert np.isclose(schedules.schedule("karras", 10, TRAINING)[0], TRAINING[-1])  # sigma_max ~14.61
    np.testing.assert_allclose(TRAINING, k_reference.model_sigmas(), rtol=1e-12)


@pytest.mark.parametrize("name,order", sorted(DETERMINISTIC.items()))
def test_deterministic_samplers_converge_at_their_order(name, order):
    # To sigma_min, not 0: the samplers' last step to 0 is by design a first-order jump to D(x, sigma_min),
    # an error that does not shrink with the steps.
    x = RNG.standard_normal(SHAPE) * TRAINING[-1]
    errors = []
    for steps in (8, 16, 32, 64):
        sigmas = schedules.schedule("karras", steps, TRAINING)[:-1]
        errors.append(np.max(np.abs(run_jax(name, x, sigmas) - exact(x, sigmas[0], sigmas[-1]))))
    slopes = -np.diff(np.log2(errors))  # error ~ steps^-order: each doubling divides it by 2^order
    assert errors[-1] < errors[0] / 2 ** (3 * order - 1), errors
    assert slopes[-1] > order - 0.3, (errors, slopes)


@pytest.mark.parametrize("name", sorted(set(K_SAMPLERS) - set(DETERMINISTIC)))
@pytest.mark.slow
def test_stochastic_samplers_end_with_the_datas_distribution(name):
    import jax
    import jax.numpy as jnp

    shape = (32, 4, 16, 16)  # 32,768 samples of N(mu, V) with one mu: mean and variance are measurable
    sigmas = schedules.schedule("karras", 200, TRAINING)  # many steps: the SDEs' discretisation error is small
    noise = key_noise(jax.random.PRNGKey(1), shape, jnp.float32)
    start = jax.random.normal(jax.random.PRNGKey(0), shape) * float(sigmas[0])
    out = np.asarray(jax.jit(lambda x: K_SAMPLERS[name](denoiser(0.3, V), x, sigmas, noise))(start))
    assert abs(out.mean() - 0.3) < 0.01, out.mean()
    if name not in ("lcm", "tcd"):  # their jumps to each x0 estimate assume a consistency-distilled model
        assert abs(out.var() - V) < 0.05 * V, out.var()


def test_sampler_noise_is_its_own_per_image_and_step():
    import jax
    import jax.numpy as jnp

    noise = key_noise(jax.random.PRNGKey(0), (4, 4, 8, 8), jnp.float32)
    draws = np.stack([np.asarray(noise(i, j)) for i in range(3) for j in range(2)])
    flat = draws.reshape(-1, 4 * 8 * 8)  # every (step, draw, image) row
    assert len({row.tobytes() for row in flat}) == len(flat)
    np.testing.assert_array_equal(np.asarray(noise(2, 1)), draws[5])  # the same key gives the same draws


@pytest.mark.parametrize("given,sampler,sigmas", [
    (("DPM++ 2M Karras", "pndm"), "dpmpp_2m", "karras"),
    (("dpm++ 2m  karras", "pndm"), "dpmpp_2m", "karras"),
    (("dpmpp_2m", "karras"), "dpmpp_2m", "karras"),
    (("DPM++ 2M", "pndm"), "dpmpp_2m", "normal"),
    (("Euler a", "exponential"), "euler_ancestral", "exponential"),
    (("DPM++ SDE Karras", "karras"), "dpmpp_sde", "karras"),
    (("DPM++ 3M SDE Exponential", "pndm"), "dpmpp_3m_sde", "exponential"),
    (("euler_ancestral", "sgm_uniform"), "euler_ancestral", "sgm_uniform"),
    (("LCM", "simple"), "lcm", "simple"),
    (("UniPC", "pndm"), "uni_pc", "normal"),
    (("uni_pc_bh2", "karras"), "uni_pc_bh2", "karras"),
    (("DDIM", "pndm"), "scheduler", None),
    (("PLMS", "pndm"), "scheduler", None),
    ((None, "euler"), "scheduler", None),
])
def test_names_as_a1111_and_comfyui_spell_them(given, sampler, sigmas):
    chosen = names.resolve(*given)
    assert (chosen.sampler, chosen.sigmas) == (sampler, sigmas)


def test_a1111_reads_the_sampler_back():
    assert names.resolve("dpmpp_2m", "karras").a1111 == ("DPM++ 2M", "Karras")
    assert names.resolve("Euler a", "pndm").a1111 == ("Euler a", "Normal")
    assert names.resolve("DDIM", "pndm").a1111 == ("ddim", None)


def _plan(*overrides):
    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan

    return make_plan(admit(compose_cfg(["+experiment=smoke", *overrides])), 8)


SAMPLER_NAMES = [*names.A1111, *names.K_SAMPLERS, *names.DIFFUSERS]


@pytest.mark.parametrize("number,name", enumerate(SAMPLER_NAMES))
def test_every_sampler_name_is_written_into_the_records_and_read_back_as_itself(number, name):
    """Each name a user may give (the k samplers on each schedule in turn): its image records and A1111 infotext
    are written (``uni_pc_bh2`` had no A1111 name: StopIteration after generating) and from_png's reading of
    that infotext runs the same sampler on the same schedule."""
    from sdjax_runner.config import infotext
    from sdjax_runner.record.rundir import a1111_parameters, image_meta

    takes_schedule = names.resolve(name, "pndm").sigmas is not None
    schedule = names.SCHEDULES[number % len(names.SCHEDULES)] if takes_schedule else "pndm"
    plan = _plan(f"sampler='{name}'", f"scheduler={schedule}")
    text = a1111_parameters(dataclasses.replace(image_meta(plan, 64, 64), index=0, batch=0, device=0, prompt="a cat",
                                                seed=0))
    read = infotext.overrides(infotext.parse(text), ("tiny-random",), ("fp32",), False)
    assert _plan(*read.overrides).sampling == plan.sampling, text
    if name == "uni_pc_bh2":  # A1111's own spelling: its UniPC with the variant setting it writes when not bh1
        assert "Sampler: UniPC, Schedule type: " in text and "UniPC variant: bh2, " in text


@pytest.mark.parametrize("settings, runs, said", [
    ("Sampler: UniPC, UniPC variant: bh2", ("uni_pc_bh2", "normal"), None),
    ("Sampler: UniPC Karras, UniPC variant: bh2", ("uni_pc_bh2", "karras"), None),
    ("Sampler: UniPC, Schedule type: Exponential, UniPC variant: bh2", ("uni_pc_bh2", "exponential"), None),
    ("Sampler: UniPC, UniPC variant: bh1", ("uni_pc", "normal"), None),
    ("Sampler: UniPC, UniPC variant: vary_coeff", ("uni_pc", "normal"),
     "UniPC variant: vary_coeff: not honoured, bh1 runs (allowed: bh1, bh2)"),
    ("Sampler: Euler a, UniPC variant: bh2", ("euler_ancestral", "normal"), "UniPC variant: bh2: not honoured (a UniPC setting"),
])
def test_a1111s_unipc_variant_is_read_from_an_infotext(settings, runs, said):
    from sdjax_runner.config import infotext

    read = infotext.overrides(infotext.parse(f"a cat\nSteps: 4, {settings}, Seed: 1"), ("tiny-random",), ("fp32",),
                              False)
    sampling = _plan(*read.overrides).sampling
    assert (sampling.sampler, sampling.sigmas) == runs
    unipc_lines = [line for line in read.not_honoured if "UniPC" in line]
    assert len(unipc_lines) == (0 if said is None else 1) and all(line.startswith(said) for line in unipc_lines)


def test_bad_sampler_names_are_one_line(tmp_path):
    for args, expected in [
        (["sampler=DPM++ 9M"], "error: sampler: unknown sampler 'DPM++ 9M' (allowed: Euler, Euler a, Heun,"),
        (["sampler=UniPC", "sampling.num_inference_steps=1"], "error: sampling.num_inference_steps: 1: UniPC takes "
                                                              "at least 2 steps"),
        (["scheduler=karras"], "error: scheduler: karras is a sigma schedule of the k-diffusion samplers"),
        (["sampler=DPM++ 2M Karras", "scheduler=exponential"], "error: scheduler: exponential, but sampler=DPM++ 2M "
                                                              "Karras names the karras schedule"),
        (["sampler=DDIM", "scheduler=karras"], "error: sampler: DDIM steps on its own timesteps"),
        (["sampler=Euler", "sampling.eta=0.5"], "error: sampling.eta: Euler adds no noise: eta would change nothing "
                                                "(allowed: null, or one of the samplers that take it: Euler a, DPM2 a,"),
        (["sampler=Euler a", "sampling.eta=2"], "error: sampling.eta: must be between 0 and 1, got 2.0"),
    ]:
        assert_one_line_error(call_cli("+experiment=smoke", *args, cwd=tmp_path), expected)
    assert not (tmp_path / "outputs" / "runs").exists() or not any((tmp_path / "outputs" / "runs").rglob("*.png"))


def _job_images(job_dir):
    from PIL import Image

    records = json.loads((job_dir / "images.json").read_text())
    texts = []
    for record in records:
        with Image.open(job_dir / record["file"]) as image:
            texts.append(dict(image.text))
    return records, texts


@pytest.mark.slow
def test_samplers_through_the_unet_as_users_name_them(tmp_path, tiny_model_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "sampler=Euler a,DPM++ 2M Karras,dpmpp_2m,uni_pc", "tracking=none",
                     "compilation_cache.executables=false", *ONE_DEVICE, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = [sweep / str(n) for n in range(4)]
    params = []
    for job, (sampler, schedule) in zip(jobs, [("Euler a", "Normal"), ("DPM++ 2M", "Karras"), ("DPM++ 2M", "Normal"),
                                               ("UniPC", "Normal")], strict=True):
        records, texts = _job_images(job)
        assert all(r["sampler"] == sampler and r["schedule_type"] == schedule for r in records)
        assert all(f"Sampler: {sampler}, Schedule type: {schedule}, CFG scale: 7.5" in t["parameters"] for t in texts)
        assert all(r["non_finite"] is False for r in records)
        params.append({r["pixels_sha256"] for r in records})
    assert len(set().union(*params)) == 4 * len(params[0])  # four samplers, four sets of images
    timings = [json.loads((job / "timings.json").read_text()) for job in jobs]
    assert [t["process_model_loads"] for t in timings] == [1, 1, 1, 1]  # one load; each sampler its own program
    assert [t["process_compiles"] for t in timings] == [1, 2, 3, 4]
    # ... and one decoding program for the four: the model's at this size, traced and compiled by the first job alone
    assert result.stdout.count("compile: the decoder") == 1 and "compile: the decoder, " in result.stdout
    assert [t["trace_s"] > 0 for t in timings] == [True] * 4  # (each sampler's own loop is traced)

    # An ancestral run is repeatable bit for bit in a run of its own (a fresh process state: no program or key
    # carried over from the sweep).
    again = run_cli("+experiment=smoke", "sampler=Euler a", "tracking=none", *ONE_DEVICE,
                    f"hydra.run.dir={tmp_path / 'again'}",
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert {r["pixels_sha256"] for r in _job_images(tmp_path / "again")[0]} == params[0]
    # DDIM with eta: diffusers' Flax DDIM computes sigma_t but adds no noise; here eta 1 is another picture.
    ddim = run_cli("-m", "+experiment=smoke", "sampler=DDIM", "sampling.eta=0,1", "tracking=none", *ONE_DEVICE,
                   f"hydra.sweep.dir={tmp_path / 'ddim'}", cwd=tmp_path)
    assert ddim.returncode == 0, ddim.stderr
    hashes = [{r["pixels_sha256"] for r in _job_images(tmp_path / "ddim" / job)[0]} for job in ("0", "1")]
    assert not hashes[0] & hashes[1]
    records, texts = _job_images(tmp_path / "ddim" / "1")
    assert records[0]["eta"] == 1.0 and "Sampler: ddim, CFG scale: 7.5" in texts[0]["parameters"]
    assert ", Eta DDIM: 1.0" in texts[0]["parameters"]
    # v-prediction in bf16 and fp16: finite, every image its own.
    v = run_cli("-m", "+experiment=smoke", "sampler=DPM++ 2M SDE Karras", "model.prediction_type=v_prediction",
                "dtype=bf16,fp16", "tracking=none", *ONE_DEVICE, f"hydra.sweep.dir={tmp_path / 'v'}", cwd=tmp_path)
    assert v.returncode == 0, v.stderr
    for job in ("0", "1"):
        records, _ = _job_images(tmp_path / "v" / job)
        assert all(r["non_finite"] is False for r in records) and len({r["pixels_sha256"] for r in records}) == 8


def test_each_sampler_is_one_registry_entry_and_its_function_agrees_with_it():
    """config/samplers.py's SAMPLERS holds everything about a k sampler; the engine holds only its function,
    under the same name. What the entry says of eta is what the function takes (its own default included), and
    the tables other modules read are the registry's, not lists of their own."""
    import inspect

    from sdjax_runner.engine.samplers import SAMPLERS as RUNS
    from sdjax_runner.engine.samplers.k_samplers import K_SAMPLERS as FUNCTIONS

    assert tuple(FUNCTIONS) == tuple(names.SAMPLERS) == names.K_SAMPLERS
    assert set(RUNS) == {"scheduler", *names.SAMPLERS}
    for name, entry in names.SAMPLERS.items():
        parameters = inspect.signature(FUNCTIONS[name]).parameters
        if entry.eta is None:
            assert "eta" not in parameters, name
        else:
            assert parameters["eta"].default == entry.eta == names.ETA[name], name
        assert names.MIN_STEPS.get(name, 1) == entry.min_steps
        spelled = names.resolve(entry.a1111, "pndm").sampler if entry.a1111 and not entry.a1111_settings else name
        assert spelled == name  # its A1111 name (where that alone picks it) resolves to it
    assert names.UNIPC_VARIANTS == {"bh1": "uni_pc", "bh2": "uni_pc_bh2"}
