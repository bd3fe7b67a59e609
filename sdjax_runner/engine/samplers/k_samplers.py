"""The k-diffusion samplers (A1111's and ComfyUI's Euler, Euler a, Heun, DPM2, DPM++ 2M, ...), written in JAX.

Each runs in sigma space, as k-diffusion does: the sample starts as ``noise * sigmas[0]`` and a
``denoiser(x, sigma) -> x0`` (the UNet with its scalings and classifier-free guidance: :mod:`.k_model`)
is called once or twice per step. The whole loop is one ``lax.fori_loop`` over the steps: the sigmas are
host values (a NumPy array made from the model's training schedule) and constants of the program, multistep history
(DPM++ 2M, 3M SDE, LMS) is carried through the loop, and the two-evaluation samplers take their plain Euler
step at the last sigma with a ``lax.cond``, as k-diffusion's ``if sigmas[i + 1] == 0`` does.

Every sampler takes ``start``: the step it starts at (img2img and inpainting start part-way down the
schedule; a traced number, so a strength sweep compiles once). Running from ``start`` on ``sigmas`` is
running on ``sigmas[start:]`` -- the first step is first-order, the multistep history begins there --
with step i still drawing step i's noise.

``noise(i, j)`` is the j-th standard normal draw of step i, drawn where k-diffusion draws (``randn_like`` or
its noise sampler); the program makes it from the device's key (:func:`key_noise`), tests pass fixed
arrays. The algorithms follow crowsonkb/k-diffusion ``k_diffusion/sampling.py`` (LCM: ComfyUI's
``sample_lcm``), with its defaults: eta 1, s_noise 1, no churn, r = 1/2, DPM++ 2M SDE's midpoint solver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sdjax_runner.engine.samplers import unipc
from sdjax_runner.engine.samplers.starts import per_start

Denoiser = Callable[[Any, Any], Any]  # (x, sigma) -> x0
Noise = Callable[[Any, int], Any]  # (step index, draw) -> standard normal, shaped like x


def _ancestral(sigma_from, sigma_to, eta: float = 1.0):
    """k-diffusion's get_ancestral_step: (sigma_down, sigma_up)."""
    import jax.numpy as jnp

    sigma_up = jnp.minimum(sigma_to, eta * jnp.sqrt(sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2))
    return jnp.sqrt(sigma_to**2 - sigma_up**2), sigma_up


def _steps(sigmas, x, step, carry=None, start=0):
    """``step(i, sigma, sigma_next, carry) -> carry`` over the steps from ``start`` in one ``lax.fori_loop``
    (``carry``: ``x`` unless given); ``sigmas`` are host values, made constants of the program in the
    sample's dtype."""
    import jax
    import jax.numpy as jnp

    constants = jnp.asarray(np.asarray(sigmas), x.dtype)
    return jax.lax.fori_loop(start, len(sigmas) - 1, lambda i, c: step(i, constants[i], constants[i + 1], c),
                             x if carry is None else carry)


def _derivative(model: Denoiser, x, sigma):
    """k-diffusion's to_d: the ODE's dx/dsigma at ``x``."""
    return (x - model(x, sigma)) / sigma


def _last(sigma_next, plain, full, x):
    """``plain(x)`` where ``sigma_next`` is 0 (the last step), else ``full(x)``."""
    import jax

    return jax.lax.cond(sigma_next == 0, plain, full, x)


def _noise_if(condition, draw, scale):
    import jax.numpy as jnp

    return jnp.where(condition, draw * scale, 0.0)


def euler(model: Denoiser, x, sigmas, noise: Noise, start=0):
    return _steps(sigmas, x, lambda i, sigma, sigma_next, x:
                  x + _derivative(model, x, sigma) * (sigma_next - sigma), start=start)


def euler_ancestral(model: Denoiser, x, sigmas, noise: Noise, eta: float = 1.0, start=0):
    def step(i, sigma, sigma_next, x):
        sigma_down, sigma_up = _ancestral(sigma, sigma_next, eta)
        x = x + _derivative(model, x, sigma) * (sigma_down - sigma)
        return x + _noise_if(sigma_next > 0, noise(i, 0), sigma_up)

    return _steps(sigmas, x, step, start=start)


def heun(model: Denoiser, x, sigmas, noise: Noise, start=0):
    def step(i, sigma, sigma_next, x):
        d = _derivative(model, x, sigma)
        dt = sigma_next - sigma

        def corrected(x):
            x_2 = x + d * dt
            return x + (d + _derivative(model, x_2, sigma_next)) / 2 * dt

        return _last(sigma_next, lambda x: x + d * dt, corrected, x)

    return _steps(sigmas, x, step, start=start)


def _midpoint_step(model: Denoiser, x, d, sigma, target):
    """DPM2's second-order step from ``sigma`` to ``target`` through the log-midpoint."""
    import jax.numpy as jnp

    sigma_mid = jnp.exp((jnp.log(sigma) + jnp.log(target)) / 2)
    x_2 = x + d * (sigma_mid - sigma)
    return x + _derivative(model, x_2, sigma_mid) * (target - sigma)


def _dpm_2_to(model: Denoiser, x, sigma, target):
    """DPM2 from ``sigma`` to ``target``: a plain Euler step where ``target`` is 0."""
    d = _derivative(model, x, sigma)
    return _last(target, lambda x: x + d * (target - sigma), lambda x: _midpoint_step(model, x, d, sigma, target), x)


def dpm_2(model: Denoiser, x, sigmas, noise: Noise, start=0):
    return _steps(sigmas, x, lambda i, sigma, sigma_next, x: _dpm_2_to(model, x, sigma, sigma_next), start=start)


def dpm_2_ancestral(model: Denoiser, x, sigmas, noise: Noise, eta: float = 1.0, start=0):
    def step(i, sigma, sigma_next, x):
        sigma_down, sigma_up = _ancestral(sigma, sigma_next, eta)
        return _dpm_2_to(model, x, sigma, sigma_down) + noise(i, 0) * sigma_up

    return _steps(sigmas, x, step, start=start)


LMS_ORDER = 4


def lms_coefficients(sigmas: np.ndarray, order: int = LMS_ORDER) -> np.ndarray:
    """(steps, order) weights of the newest-first derivatives: the integral over [sigma_i, sigma_i+1] of
    each Lagrange basis polynomial through the last ``min(i + 1, order)`` sigmas (k-diffusion's
    linear_multistep_coeff), integrated exactly on the host (the sigmas are constants of the program)."""
    from numpy.polynomial import polynomial

    sigmas = np.asarray(sigmas, np.float64)
    table = np.zeros((len(sigmas) - 1, order))
    for i in range(len(sigmas) - 1):
        used = min(i + 1, order)
        for j in range(used):
            basis = np.array([1.0])
            for k in range(used):
                if k != j:
                    basis = polynomial.polymul(basis, np.array([-sigmas[i - k], 1.0]) / (sigmas[i - j] - sigmas[i - k]))
            antiderivative = polynomial.polyint(basis)
            table[i, j] = polynomial.polyval(sigmas[i + 1], antiderivative) - polynomial.polyval(sigmas[i], antiderivative)
    return table


def lms(model: Denoiser, x, sigmas, noise: Noise, start=0):
    import jax.numpy as jnp

    coefficients = jnp.asarray(per_start(lms_coefficients, sigmas, start), x.dtype)  # [start, step]

    def step(i, sigma, sigma_next, carry):
        x, history = carry  # the last LMS_ORDER derivatives, newest first
        history = jnp.concatenate([_derivative(model, x, sigma)[None], history[:-1]])
        return x + jnp.tensordot(coefficients[start, i], history, axes=1), history

    return _steps(sigmas, x, step, (x, jnp.zeros((LMS_ORDER,) + x.shape, x.dtype)), start)[0]


def dpmpp_2s_ancestral(model: Denoiser, x, sigmas, noise: Noise, eta: float = 1.0, start=0):
    import jax.numpy as jnp

    def step(i, sigma, sigma_next, x):
        denoised = model(x, sigma)
        sigma_down, sigma_up = _ancestral(sigma, sigma_next, eta)

        def second_order(x):
            h = jnp.log(sigma) - jnp.log(sigma_down)  # t_next - t, with t = -log(sigma)
            sigma_s = sigma * jnp.exp(-h / 2)
            x_2 = (sigma_s / sigma) * x - jnp.expm1(-h / 2) * denoised
            return (sigma_down / sigma) * x - jnp.expm1(-h) * model(x_2, sigma_s)

        x = _last(sigma_down, lambda x: x + (x - denoised) / sigma * (sigma_down - sigma), second_order, x)
        return x + _noise_if(sigma_next > 0, noise(i, 0), sigma_up)

    return _steps(sigmas, x, step, start=start)


def dpmpp_sde(model: Denoiser, x, sigmas, noise: Noise, eta: float = 1.0, start=0):
    import jax.numpy as jnp

    def step(i, sigma, sigma_next, x):
        denoised = model(x, sigma)

        def stochastic(x):
            sigma_s = jnp.sqrt(sigma * sigma_next)  # t + h / 2 in t = -log(sigma)
            down, up = _ancestral(sigma, sigma_s, eta)
            x_2 = (down / sigma) * x - jnp.expm1(jnp.log(down / sigma)) * denoised + noise(i, 0) * up
            denoised_2 = model(x_2, sigma_s)
            down, up = _ancestral(sigma, sigma_next, eta)
            # fac = 1 / (2 r) = 1: the second denoised alone
            return (down / sigma) * x - jnp.expm1(jnp.log(down / sigma)) * denoised_2 + noise(i, 1) * up

        return _last(sigma_next, lambda x: x + (x - denoised) / sigma * (sigma_next - sigma), stochastic, x)

    return _steps(sigmas, x, step, start=start)


def _log_step(sigma, sigma_next):
    """(h = log(sigma / sigma_next), whether this is the last step); h is 1 on the last step, whose
    update does not use it (x becomes the denoised sample there), so nothing infinite is carried."""
    import jax.numpy as jnp

    last = sigma_next == 0
    return jnp.where(last, 1.0, jnp.log(sigma) - jnp.log(jnp.where(last, 1.0, sigma_next))), last


def dpmpp_2m(model: Denoiser, x, sigmas, noise: Noise, start=0):
    import jax.numpy as jnp

    def step(i, sigma, sigma_next, carry):
        x, old, h_last = carry
        denoised = model(x, sigma)
        h, last = _log_step(sigma, sigma_next)
        first_order = (i == start) | last
        r = jnp.where(first_order, 1.0, h_last / h)
        corrected = jnp.where(first_order, denoised, (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old)
        return jnp.where(last, denoised, (sigma_next / sigma) * x - jnp.expm1(-h) * corrected), denoised, h

    return _steps(sigmas, x, step, (x, jnp.zeros_like(x), jnp.ones((), x.dtype)), start)[0]


def dpmpp_2m_sde(model: Denoiser, x, sigmas, noise: Noise, eta: float = 1.0, start=0):
    import jax.numpy as jnp

    def step(i, sigma, sigma_next, carry):
        x, old, h_last = carry
        denoised = model(x, sigma)
        h, last = _log_step(sigma, sigma_next)
        eta_h = eta * h
        moved = sigma_next / sigma * jnp.exp(-eta_h) * x - jnp.expm1(-h - eta_h) * denoised
        correction = -0.5 * jnp.expm1(-h - eta_h) * (h / h_last) * (denoised - old)
        moved = moved + jnp.where(i == start, 0.0, correction)
        moved = moved + noise(i, 0) * sigma_next * jnp.sqrt(-jnp.expm1(-2 * eta_h))
        return jnp.where(last, denoised, moved), denoised, h

    return _steps(sigmas, x, step, (x, jnp.zeros_like(x), jnp.ones((), x.dtype)), start)[0]


def dpmpp_3m_sde(model: Denoiser, x, sigmas, noise: Noise, eta: float = 1.0, start=0):
    import jax.numpy as jnp

    def step(i, sigma, sigma_next, carry):
        x, denoised_1, denoised_2, h_1, h_2 = carry
        denoised = model(x, sigma)
        h, last = _log_step(sigma, sigma_next)
        h_eta = h * (eta + 1)
        moved = jnp.exp(-h_eta) * x - jnp.expm1(-h_eta) * denoised
        phi_2 = jnp.expm1(-h_eta) / h_eta + 1
        phi_3 = phi_2 / h_eta - 0.5
        r0, r1 = h_1 / h, h_2 / h
        d1_0 = (denoised - denoised_1) / r0
        d1_1 = (denoised_1 - denoised_2) / r1
        third = phi_2 * (d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)) - phi_3 * (d1_0 - d1_1) / (r0 + r1)
        moved = moved + jnp.where(i >= start + 2, third, jnp.where(i == start + 1, phi_2 * d1_0, 0.0))
        moved = moved + noise(i, 0) * sigma_next * jnp.sqrt(-jnp.expm1(-2 * h * eta))
        return jnp.where(last, denoised, moved), denoised, denoised_1, h, h_1

    zeros, ones = jnp.zeros_like(x), jnp.ones((), x.dtype)
    return _steps(sigmas, x, step, (x, zeros, zeros, ones, ones), start)[0]


def lcm(model: Denoiser, x, sigmas, noise: Noise, start=0):
    return _steps(sigmas, x, lambda i, sigma, sigma_next, x:
                  model(x, sigma) + _noise_if(sigma_next > 0, noise(i, 0), sigma_next), start=start)


def tcd_alphas(sigmas, training, eta: float) -> np.ndarray:
    """TCD's alphas_cumprod at each step's landing timestep ``floor((1 - eta) * t(sigma))`` (the last one timestep 0):
    ``t(sigma)`` the training timestep whose sigma is nearest in log (ComfyUI's ``model_sampling.timestep``),
    alphas_cumprod ``1 / (1 + sigma^2)`` of the training sigmas."""
    sigmas, training = np.asarray(sigmas, np.float64), np.asarray(training, np.float64)
    with np.errstate(divide="ignore"):
        nearest = np.abs(np.log(sigmas)[None, :] - np.log(training)[:, None]).argmin(axis=0)
    landing = np.floor((1 - eta) * nearest).astype(np.int64)
    landing[-1] = 0
    return 1 / (1 + training[landing] ** 2)


def tcd(model: Denoiser, x, sigmas, noise: Noise, eta: float = 0.3, start=0, training=None):
    """ComfyUI's ``sample_tcd`` (Trajectory Consistency Distillation's sampler, its ``eta`` the gamma of the paper):
    each step's x0 and eps estimates are moved to the landing timestep (:func:`tcd_alphas`), then noised forward to
    the next sigma -- or, at eta 0 and on the last step, scaled there. ``training``: the model's training sigmas
    (config/samplers.py's entry says the sampler reads them; Stable Diffusion's by default)."""
    import jax.numpy as jnp

    if training is None:
        from sdjax_runner.engine.samplers.sigmas import training_sigmas

        training = training_sigmas({})
    alphas = jnp.asarray(tcd_alphas(sigmas, training, eta), x.dtype)

    def step(i, sigma, sigma_next, x):
        denoised = model(x, sigma)
        eps = (x - denoised) / sigma
        alpha = alphas[i + 1]
        landed = jnp.sqrt(alpha) * denoised + jnp.sqrt(1 - alpha) * eps
        if eta <= 0:
            return landed * jnp.sqrt(1 + sigma_next**2)
        # (at most 0 under the root only by float32 rounding, where the landing sigma is the next one: 0 then)
        noised = landed / jnp.sqrt(alpha) + noise(i, 0) * jnp.sqrt(jnp.maximum(sigma_next**2 + 1 - 1 / alpha, 0))
        return jnp.where(sigma_next > 0, noised, landed * jnp.sqrt(1 + sigma_next**2))

    return _steps(sigmas, x, step, start=start)


# The functions, by k-diffusion's and ComfyUI's names; all else about each sampler (A1111's name, eta, minimum
# steps, schedule quirks) is its entry in config/samplers.py's SAMPLERS.
K_SAMPLERS = {"euler": euler, "euler_ancestral": euler_ancestral, "heun": heun, "dpm_2": dpm_2,
              "dpm_2_ancestral": dpm_2_ancestral, "lms": lms, "dpmpp_2s_ancestral": dpmpp_2s_ancestral,
              "dpmpp_sde": dpmpp_sde, "dpmpp_2m": dpmpp_2m, "dpmpp_2m_sde": dpmpp_2m_sde,
              "dpmpp_3m_sde": dpmpp_3m_sde, "lcm": lcm, "tcd": tcd, "uni_pc": unipc.sampler(3, "bh1"),
              "uni_pc_bh2": unipc.sampler(3, "bh2")}


NOISE_STREAM = 1  # a sampler's noise key: the device key folded with this (the initial latents use the key itself)


def key_noise(key, shape, dtype) -> Noise:
    """Draws from ``key`` (the device's): step i's j-th draw is its own stream, and each image of the
    device's batch gets its own rows of it."""
    import jax

    return lambda i, j: jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, i), j), shape, dtype)
