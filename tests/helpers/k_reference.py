"""An independent NumPy reference of k-diffusion's published algorithms, for tests.

The runner's own samplers and schedules are JAX code; this module is a second, plain NumPy (float64)
transcription of the published sources, written from them and not from the runner, so that tests can
compare the two. Sources (step order, formulas and defaults kept as published):

* crowsonkb/k-diffusion ``k_diffusion/sampling.py``: the ``sample_*`` functions, ``get_ancestral_step``,
  ``linear_multistep_coeff``, ``get_sigmas_karras`` / ``get_sigmas_exponential``; defaults eta=1,
  s_noise=1, s_churn=0, r=1/2 (dpmpp_sde), solver_type='midpoint' (dpmpp_2m_sde), order=4 (lms).
* crowsonkb/k-diffusion ``k_diffusion/external.py``: ``DiscreteSchedule`` (sigma_to_t, t_to_sigma,
  get_sigmas).
* comfyanonymous/ComfyUI ``comfy/samplers.py`` (``simple_scheduler``, ``normal_scheduler(sgm=True)``) and
  ``comfy/k_diffusion/sampling.py`` (``sample_lcm``, with the EPS ``noise_scaling``: x0 + sigma * noise;
  ``sample_tcd`` with ``ModelSamplingDiscrete.timestep``: the training index nearest in log-sigma).
* comfyanonymous/ComfyUI ``comfy/extra_samplers/uni_pc.py`` (``sample_unipc`` / ``sample_unipc_bh2``, the
  ``SigmaConvert`` version, commit 9bffd67f): ``UniPC.sample`` (method='multistep', lower_order_final=True)
  and ``multistep_uni_pc_bh_update`` (predict_x0=True), written in sigma space (see ``unipc``).

Conventions: ``denoiser(x, sigma) -> x0`` with sigma a Python float; ``x`` is already ``noise * sigmas[0]``;
``sigmas`` decrease and end with 0; ``noise(i, j)`` is the j-th standard normal draw of step i, called
exactly where the source calls ``torch.randn_like`` or its ``noise_sampler`` (the Brownian-tree samplers'
increments are replaced by these independent standard normals). The sources compute in float32 tensors;
this reference computes in float64, so compare with a tolerance.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import integrate

# How many noise(i, j) draws step i makes, and when (j counts from 0 within each step).
DRAWS = {
    "euler": "none (the source's per-step randn_like eps is unused with s_churn=0)",
    "euler_ancestral": "1 (j=0) if sigmas[i+1] > 0, after the Euler step to sigma_down",
    "heun": "none (the source's per-step randn_like eps is unused with s_churn=0)",
    "dpm_2": "none (the source's per-step randn_like eps is unused with s_churn=0)",
    "dpm_2_ancestral": "1 (j=0) if sigma_down != 0 (i.e. sigmas[i+1] > 0), after the midpoint step",
    "lms": "none",
    "dpmpp_2s_ancestral": "1 (j=0) if sigmas[i+1] > 0, after the 2S step to sigma_down",
    "dpmpp_sde": "2 if sigmas[i+1] > 0: j=0 for the substep to the midpoint s, j=1 for the full step; "
                 "none on the last (Euler) step (k-diffusion's Brownian tree makes the two correlated; "
                 "here they are whatever noise(i, 0) and noise(i, 1) are)",
    "dpmpp_2m": "none",
    "dpmpp_2m_sde": "1 (j=0) if sigmas[i+1] > 0, after the (multistep-corrected) update",
    "dpmpp_3m_sde": "1 (j=0) if sigmas[i+1] > 0, after the (multistep-corrected) update",
    "lcm": "1 (j=0) if sigmas[i+1] > 0: x = denoised + sigmas[i+1] * noise",
    "tcd": "1 (j=0) if eta > 0 and sigmas[i+1] > 0, after the move to the landing timestep",
    "uni_pc": "none",
    "uni_pc_bh2": "none",
}


def _draws(noise, i):
    """noise(i, 0), noise(i, 1), ... on successive calls (the draws of step i, in order)."""
    counter = itertools.count()
    return lambda: np.asarray(noise(i, next(counter)), dtype=np.float64)


def _to_d(x, sigma, denoised):
    """k-diffusion ``to_d``: the Karras ODE derivative."""
    return (x - denoised) / sigma


def _ancestral_step(sigma_from, sigma_to, eta=1.0):
    """k-diffusion ``get_ancestral_step``: (sigma_down, sigma_up)."""
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * (sigma_to ** 2 * (sigma_from ** 2 - sigma_to ** 2) / sigma_from ** 2) ** 0.5)
    sigma_down = (sigma_to ** 2 - sigma_up ** 2) ** 0.5
    return sigma_down, sigma_up


def _t_fn(sigma):  # k-diffusion's t_fn: sigma.log().neg() (log 0 = -inf)
    return -math.log(sigma) if sigma > 0 else math.inf


def _sigma_fn(t):  # k-diffusion's sigma_fn: t.neg().exp()
    return math.exp(-t)


def _log_midpoint(a, b):
    """``a.log().lerp(b.log(), 0.5).exp()``, the DPM-Solver-2 midpoint of k-diffusion's dpm_2 samplers."""
    return math.exp(math.log(a) + 0.5 * (math.log(b) - math.log(a)))


def _euler(model, x, s, noise):
    """k-diffusion ``sample_euler`` (s_churn=0, so sigma_hat = sigmas[i])."""
    for i in range(len(s) - 1):
        d = _to_d(x, s[i], model(x, s[i]))
        x = x + d * (s[i + 1] - s[i])
    return x


def _euler_ancestral(model, x, s, noise, eta=1.0):
    """k-diffusion ``sample_euler_ancestral`` (eta=1, s_noise=1)."""
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])
        sigma_down, sigma_up = _ancestral_step(s[i], s[i + 1], eta)
        x = x + _to_d(x, s[i], denoised) * (sigma_down - s[i])
        if s[i + 1] > 0:
            x = x + draw() * sigma_up
    return x


def _heun(model, x, s, noise):
    """k-diffusion ``sample_heun`` (s_churn=0): Heun steps, a plain Euler step to sigma 0."""
    for i in range(len(s) - 1):
        d = _to_d(x, s[i], model(x, s[i]))
        dt = s[i + 1] - s[i]
        if s[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            d_2 = _to_d(x_2, s[i + 1], model(x_2, s[i + 1]))
            x = x + (d + d_2) / 2 * dt
    return x


def _dpm_2(model, x, s, noise):
    """k-diffusion ``sample_dpm_2`` (s_churn=0): midpoint at the geometric mean (log-space lerp 0.5)."""
    for i in range(len(s) - 1):
        d = _to_d(x, s[i], model(x, s[i]))
        if s[i + 1] == 0:
            x = x + d * (s[i + 1] - s[i])
        else:
            sigma_mid = _log_midpoint(s[i], s[i + 1])
            x_2 = x + d * (sigma_mid - s[i])
            d_2 = _to_d(x_2, sigma_mid, model(x_2, sigma_mid))
            x = x + d_2 * (s[i + 1] - s[i])
    return x


def _dpm_2_ancestral(model, x, s, noise, eta=1.0):
    """k-diffusion ``sample_dpm_2_ancestral`` (eta=1, s_noise=1)."""
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])
        sigma_down, sigma_up = _ancestral_step(s[i], s[i + 1], eta)
        d = _to_d(x, s[i], denoised)
        if sigma_down == 0:
            x = x + d * (sigma_down - s[i])
        else:
            sigma_mid = _log_midpoint(s[i], sigma_down)
            x_2 = x + d * (sigma_mid - s[i])
            d_2 = _to_d(x_2, sigma_mid, model(x_2, sigma_mid))
            x = x + d_2 * (sigma_down - s[i])
            x = x + draw() * sigma_up
    return x


def linear_multistep_coeff(order, t, i, j):
    """k-diffusion ``linear_multistep_coeff``: the integral over [t[i], t[i+1]] of the j-th Lagrange basis
    polynomial on the nodes t[i], t[i-1], ..., t[i-order+1]."""
    if order - 1 > i:
        raise ValueError(f"Order {order} too high for step {i}")

    def fn(tau):
        prod = 1.0
        for k in range(order):
            if j == k:
                continue
            prod *= (tau - t[i - k]) / (t[i - j] - t[i - k])
        return prod

    return integrate.quad(fn, t[i], t[i + 1], epsrel=1e-4)[0]


def _lms(model, x, s, noise, order=4):
    """k-diffusion ``sample_lms`` (order=4)."""
    ds = []
    for i in range(len(s) - 1):
        ds.append(_to_d(x, s[i], model(x, s[i])))
        if len(ds) > order:
            ds.pop(0)
        cur_order = min(i + 1, order)
        coeffs = [linear_multistep_coeff(cur_order, s, i, j) for j in range(cur_order)]
        x = x + sum(c * d for c, d in zip(coeffs, reversed(ds), strict=True))
    return x


def _dpmpp_2s_ancestral(model, x, s, noise, eta=1.0):
    """k-diffusion ``sample_dpmpp_2s_ancestral`` (eta=1, s_noise=1, r=1/2)."""
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])
        sigma_down, sigma_up = _ancestral_step(s[i], s[i + 1], eta)
        if sigma_down == 0:
            x = x + _to_d(x, s[i], denoised) * (sigma_down - s[i])
        else:
            t, t_next = _t_fn(s[i]), _t_fn(sigma_down)
            r = 1 / 2
            h = t_next - t
            s_ = t + r * h
            x_2 = (_sigma_fn(s_) / _sigma_fn(t)) * x - math.expm1(-h * r) * denoised
            denoised_2 = model(x_2, _sigma_fn(s_))
            x = (_sigma_fn(t_next) / _sigma_fn(t)) * x - math.expm1(-h) * denoised_2
        if s[i + 1] > 0:
            x = x + draw() * sigma_up
    return x


def _dpmpp_sde(model, x, s, noise, eta=1.0, r=1 / 2):
    """k-diffusion ``sample_dpmpp_sde`` (eta=1, s_noise=1, r=1/2); noise(i, 0) and noise(i, 1) stand in
    for the two BrownianTreeNoiseSampler calls."""
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])
        if s[i + 1] == 0:
            x = x + _to_d(x, s[i], denoised) * (s[i + 1] - s[i])
        else:
            t, t_next = _t_fn(s[i]), _t_fn(s[i + 1])
            h = t_next - t
            s_ = t + h * r
            fac = 1 / (2 * r)
            # Step 1
            sd, su = _ancestral_step(_sigma_fn(t), _sigma_fn(s_), eta)
            s_down = _t_fn(sd)
            x_2 = (_sigma_fn(s_down) / _sigma_fn(t)) * x - math.expm1(t - s_down) * denoised
            x_2 = x_2 + draw() * su
            denoised_2 = model(x_2, _sigma_fn(s_))
            # Step 2
            sd, su = _ancestral_step(_sigma_fn(t), _sigma_fn(t_next), eta)
            t_next_ = _t_fn(sd)
            denoised_d = (1 - fac) * denoised + fac * denoised_2
            x = (_sigma_fn(t_next_) / _sigma_fn(t)) * x - math.expm1(t - t_next_) * denoised_d
            x = x + draw() * su
    return x


def _dpmpp_2m(model, x, s, noise):
    """k-diffusion ``sample_dpmpp_2m``."""
    old_denoised = None
    for i in range(len(s) - 1):
        denoised = model(x, s[i])
        t, t_next = _t_fn(s[i]), _t_fn(s[i + 1])
        h = t_next - t
        if old_denoised is None or s[i + 1] == 0:
            x = (_sigma_fn(t_next) / _sigma_fn(t)) * x - math.expm1(-h) * denoised
        else:
            r = (t - _t_fn(s[i - 1])) / h
            denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
            x = (_sigma_fn(t_next) / _sigma_fn(t)) * x - math.expm1(-h) * denoised_d
        old_denoised = denoised
    return x


def _dpmpp_2m_sde(model, x, s, noise, eta=1.0):
    """k-diffusion ``sample_dpmpp_2m_sde`` (eta=1, s_noise=1, solver_type='midpoint')."""
    old_denoised, h_last, h = None, None, None
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])
        if s[i + 1] == 0:
            x = denoised
        else:
            t, s_next = -math.log(s[i]), -math.log(s[i + 1])
            h = s_next - t
            eta_h = eta * h
            x = s[i + 1] / s[i] * math.exp(-eta_h) * x + -math.expm1(-h - eta_h) * denoised
            if old_denoised is not None:
                r = h_last / h
                x = x + 0.5 * -math.expm1(-h - eta_h) * (1 / r) * (denoised - old_denoised)  # 'midpoint'
            if eta:
                x = x + draw() * s[i + 1] * math.sqrt(-math.expm1(-2 * eta_h))
        old_denoised, h_last = denoised, h
    return x


def _dpmpp_3m_sde(model, x, s, noise, eta=1.0):
    """k-diffusion ``sample_dpmpp_3m_sde`` (eta=1, s_noise=1)."""
    denoised_1, denoised_2 = None, None
    h, h_1, h_2 = None, None, None
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])
        if s[i + 1] == 0:
            x = denoised
        else:
            t, s_next = -math.log(s[i]), -math.log(s[i + 1])
            h = s_next - t
            h_eta = h * (eta + 1)
            x = math.exp(-h_eta) * x + -math.expm1(-h_eta) * denoised
            if h_2 is not None:
                r0, r1 = h_1 / h, h_2 / h
                d1_0 = (denoised - denoised_1) / r0
                d1_1 = (denoised_1 - denoised_2) / r1
                d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
                d2 = (d1_0 - d1_1) / (r0 + r1)
                phi_2 = math.expm1(-h_eta) / h_eta + 1
                phi_3 = phi_2 / h_eta - 0.5
                x = x + phi_2 * d1 - phi_3 * d2
            elif h_1 is not None:
                d = (denoised - denoised_1) / (h_1 / h)
                phi_2 = math.expm1(-h_eta) / h_eta + 1
                x = x + phi_2 * d
            if eta:
                x = x + draw() * s[i + 1] * math.sqrt(-math.expm1(-2 * h * eta))
        denoised_1, denoised_2 = denoised, denoised_1
        h_1, h_2 = h, h_1
    return x


def _lcm(model, x, s, noise):
    """ComfyUI ``sample_lcm`` (comfy/k_diffusion/sampling.py) with the EPS model's noise_scaling."""
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        x = model(x, s[i])
        if s[i + 1] > 0:
            x = draw() * s[i + 1] + x
    return x


def _tcd(model, x, s, noise, eta=0.3):
    """ComfyUI ``sample_tcd`` (comfy/k_diffusion/sampling.py) on Stable Diffusion's training schedule: timesteps_s =
    floor((1 - eta) * model_sampling.timestep(sigmas)), the last 0; alpha_prod_s = alphas_cumprod[timesteps_s]."""
    training = model_sigmas()
    log_sigmas = np.log(training)
    alphas_cumprod = 1 / (1 + training**2)  # ModelSamplingDiscrete: sigmas = ((1 - a) / a) ** 0.5

    def timestep(sigma):  # dists = log_sigma - log_sigmas[:, None]; dists.abs().argmin(dim=0)
        with np.errstate(divide="ignore"):
            return int(np.abs(math.log(sigma) - log_sigmas if sigma > 0 else -np.inf - log_sigmas).argmin())

    timesteps_s = [math.floor((1 - eta) * timestep(sigma)) for sigma in s]
    timesteps_s[-1] = 0
    alpha_prod_s = alphas_cumprod[timesteps_s]
    beta_prod_s = 1 - alpha_prod_s
    for i in range(len(s) - 1):
        draw = _draws(noise, i)
        denoised = model(x, s[i])  # predicted_original_sample
        eps = (x - denoised) / s[i]
        denoised = math.sqrt(alpha_prod_s[i + 1]) * denoised + math.sqrt(beta_prod_s[i + 1]) * eps
        x = denoised
        if eta > 0 and s[i + 1] > 0:
            x = x / math.sqrt(alpha_prod_s[i + 1]) + draw() * math.sqrt(s[i + 1] ** 2 + 1 - 1 / alpha_prod_s[i + 1])
        else:
            x = x * math.sqrt(1.0 + s[i + 1] ** 2)
    return x


# ---- UniPC (ComfyUI comfy/extra_samplers/uni_pc.py) ---------------------------------------------
#
# ComfyUI runs UniPC on a VP schedule built from the k-diffusion sigmas themselves (``SigmaConvert``:
# alpha_t = 1 / sqrt(1 + sigma^2), sigma_t = sigma / sqrt(1 + sigma^2), lambda_t = -log(sigma)), with the model
# wrapped as an eps-predictor whose data prediction is exactly ``denoiser(x_k, sigma)`` at x_k = x_vp / alpha_t
# (``predict_eps_sigma`` hands the model x_vp * sqrt(1 + sigma^2) and the sigma itself). With predict_x0=True
# every update is invariant under x_k = x_vp / alpha_t, so it is written here with alpha = 1,
# sigma = the k-diffusion sigma and lambda = -log(sigma); ComfyUI's final ``x /= marginal_alpha(timesteps[-1])``
# is that same change of variables back, so the result is x_k at timesteps[-1].

UNIPC_FINAL_SIGMA = 0.001  # what sample_unipc puts in place of a final sigma of 0 (``timesteps[-1] = 0.001``)


def _unipc_bh_update(model, x, model_prev_list, t_prev_list, t, order, variant, use_corrector):
    """ComfyUI ``UniPC.multistep_uni_pc_bh_update`` (predict_x0=True, x_t=None), in sigma space.

    ``t_prev_list`` / ``t`` are sigmas; returns (x at sigma t, the model's value at the *predicted* x at t,
    or None without the corrector)."""
    lambda_prev_0 = -math.log(t_prev_list[-1])
    lambda_t = -math.log(t)
    model_prev_0 = model_prev_list[-1]
    h = lambda_t - lambda_prev_0

    rks, D1s = [], []
    for i in range(1, order):
        lambda_prev_i = -math.log(t_prev_list[-(i + 1)])
        rk = (lambda_prev_i - lambda_prev_0) / h
        rks.append(rk)
        D1s.append((model_prev_list[-(i + 1)] - model_prev_0) / rk)
    rks.append(1.0)
    rks = np.asarray(rks, dtype=np.float64)

    hh = -h  # predict_x0
    h_phi_1 = math.expm1(hh)  # h phi_1(h) = e^h - 1
    h_phi_k = h_phi_1 / hh - 1
    factorial_i = 1
    if variant == "bh1":
        B_h = hh
    elif variant == "bh2":
        B_h = math.expm1(hh)
    else:
        raise NotImplementedError(variant)
    R, b = [], []
    for i in range(1, order + 1):
        R.append(rks ** (i - 1))
        b.append(h_phi_k * factorial_i / B_h)
        factorial_i *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial_i
    R = np.stack(R)
    b = np.asarray(b, dtype=np.float64)

    # predictor (UniP): "for order 2, we use a simplified version"
    if D1s:
        rhos_p = np.array([0.5]) if order == 2 else np.linalg.solve(R[:-1, :-1], b[:-1])
    # corrector (UniC): "for order 1, we use a simplified version"
    if use_corrector:
        rhos_c = np.array([0.5]) if order == 1 else np.linalg.solve(R, b)

    x_t_ = (t / t_prev_list[-1]) * x - h_phi_1 * model_prev_0
    pred_res = sum(r * d for r, d in zip(rhos_p, D1s, strict=True)) if D1s else 0.0
    x_t = x_t_ - B_h * pred_res

    model_t = None
    if use_corrector:
        model_t = model(x_t, t)
        corr_res = sum(r * d for r, d in zip(rhos_c[:-1], D1s, strict=True)) if D1s else 0.0
        D1_t = model_t - model_prev_0
        x_t = x_t_ - B_h * (corr_res + rhos_c[-1] * D1_t)
    return x_t, model_t


def _unipc(model, x, s, noise, variant="bh1", order=3):
    """ComfyUI ``sample_unipc(variant)`` -> ``UniPC.sample(method='multistep', lower_order_final=True)``, in
    sigma space. ``noise`` is unused (no draws)."""
    timesteps = list(s)
    if len(timesteps) < 2:
        return x
    if timesteps[-1] == 0:
        timesteps[-1] = UNIPC_FINAL_SIGMA
    steps = len(timesteps) - 1
    order = min(order, len(timesteps) - 2)  # sample_unipc: order = min(3, len(timesteps) - 2)

    model_prev_list, t_prev_list = [], []
    for step_index in range(steps):
        if step_index == 0:
            model_prev_list = [model(x, timesteps[0])]
            t_prev_list = [timesteps[0]]
        elif step_index < order:
            # warm-up: lower-order multistep UniPC, corrector on
            init_order = step_index
            x, model_x = _unipc_bh_update(model, x, model_prev_list, t_prev_list, timesteps[init_order],
                                          init_order, variant, use_corrector=True)
            model_prev_list.append(model_x)
            t_prev_list.append(timesteps[init_order])
        else:
            extra_final_step = 1 if step_index == steps - 1 else 0
            for step in range(step_index, step_index + 1 + extra_final_step):
                step_order = min(order, steps + 1 - step)  # lower_order_final
                use_corrector = step != steps  # no corrector on the last step
                x, model_x = _unipc_bh_update(model, x, model_prev_list, t_prev_list, timesteps[step],
                                              step_order, variant, use_corrector)
                for i in range(order - 1):
                    t_prev_list[i] = t_prev_list[i + 1]
                    model_prev_list[i] = model_prev_list[i + 1]
                t_prev_list[-1] = timesteps[step]
                if step < steps:
                    model_prev_list[-1] = model_x
    if steps == 1:
        # order = 0: ComfyUI's loop only evaluates the model at timesteps[0] and never moves x_vp; the final
        # division by alpha(timesteps[-1]) then rescales x_k = x_vp / alpha(timesteps[0]) by
        # alpha(timesteps[0]) / alpha(timesteps[-1]).
        x = x * math.sqrt(1 + timesteps[-1] ** 2) / math.sqrt(1 + timesteps[0] ** 2)
    return x


def unipc(denoiser, x, sigmas, variant="bh1", order=3) -> np.ndarray:
    """ComfyUI's UniPC: "uni_pc" is variant="bh1", "uni_pc_bh2" variant="bh2"; order=3 (capped, as
    sample_unipc does, at len(sigmas) - 2).

    Steps (n = len(sigmas) - 1; t = sigmas with a final 0 replaced by 0.001): one model evaluation at t[0];
    then moves 1 .. n-1 to t[1] .. t[n-1], each a UniP predictor of order min(k, order, n + 1 - k) (orders
    1, 2, ..., order during warm-up, min(order, 2) for the move to t[n-1]) followed by the model at the
    predicted point and the UniC corrector (that model value, not one at the corrected point, is what the
    next steps use); then the last move to t[n]: a first-order predictor (DPM-Solver++(1)/DDIM) with no
    corrector and no model evaluation. n model evaluations in all. With a final sigma of 0 the result is the
    sample at sigma 0.001 (no denoise-to-zero step; ComfyUI's denoise_to_zero is off and commented out).

    Not modelled: ComfyUI computes in float32 (its lambda at sigma 0.001, via log(1 - 1/(1 + sigma^2)), comes
    out as that of sigma ~0.000977 in float32), and the KSampler node's DISCARD_PENULTIMATE_SIGMA_SAMPLERS (for "uni_pc" it builds
    steps + 1 sigmas and drops the next-to-last) is a schedule matter, outside this function.
    """
    sigmas = [float(v) for v in np.asarray(sigmas, dtype=np.float64)]

    def model(x, sigma):
        return np.asarray(denoiser(x, float(sigma)), dtype=np.float64)

    out = _unipc(model, np.asarray(x, dtype=np.float64), sigmas, None, variant=variant, order=order)
    return np.asarray(out, dtype=np.float64)


SAMPLERS = {
    "euler": _euler, "euler_ancestral": _euler_ancestral, "heun": _heun, "dpm_2": _dpm_2,
    "dpm_2_ancestral": _dpm_2_ancestral, "lms": _lms, "dpmpp_2s_ancestral": _dpmpp_2s_ancestral,
    "dpmpp_sde": _dpmpp_sde, "dpmpp_2m": _dpmpp_2m, "dpmpp_2m_sde": _dpmpp_2m_sde,
    "dpmpp_3m_sde": _dpmpp_3m_sde, "lcm": _lcm, "tcd": _tcd,
    "uni_pc": lambda model, x, s, noise: _unipc(model, x, s, noise, variant="bh1"),
    "uni_pc_bh2": lambda model, x, s, noise: _unipc(model, x, s, noise, variant="bh2"),
}


def sample(name: str, denoiser, x, sigmas, noise, **options) -> np.ndarray:
    """Run k-diffusion sampler ``name`` (KeyError if unknown) from ``x`` (already ``noise * sigmas[0]``);
    ``options``: the sampler's own keywords (``eta`` of the ancestral and SDE samplers)."""
    fn = SAMPLERS[name]
    sigmas = [float(v) for v in np.asarray(sigmas, dtype=np.float64)]

    def model(x, sigma):
        return np.asarray(denoiser(x, float(sigma)), dtype=np.float64)

    return np.asarray(fn(model, np.asarray(x, dtype=np.float64), sigmas, noise, **options), dtype=np.float64)


# ---- sigma schedules ----------------------------------------------------------------------------

def model_sigmas(beta_start=0.00085, beta_end=0.012, num_train_timesteps=1000,
                 beta_schedule="scaled_linear") -> np.ndarray:
    """Stable Diffusion's training sigmas, increasing: sqrt((1 - alphas_cumprod) / alphas_cumprod)."""
    if beta_schedule == "scaled_linear":
        betas = np.linspace(beta_start ** 0.5, beta_end ** 0.5, num_train_timesteps, dtype=np.float64) ** 2
    elif beta_schedule == "linear":
        betas = np.linspace(beta_start, beta_end, num_train_timesteps, dtype=np.float64)
    else:
        raise ValueError(f"unknown beta_schedule {beta_schedule!r}")
    alphas_cumprod = np.cumprod(1.0 - betas)
    return np.sqrt((1 - alphas_cumprod) / alphas_cumprod)


def sigma_to_t(sigma, model_sigmas):
    """k-diffusion ``DiscreteSchedule.sigma_to_t`` (quantize=False): t by linear interpolation in
    log-sigma between the two neighbouring training sigmas, w clamped to [0, 1]."""
    log_sigmas = np.log(np.asarray(model_sigmas, dtype=np.float64))
    log_sigma = math.log(sigma)
    dists = log_sigma - log_sigmas
    low_idx = min(int(np.argmax(np.cumsum(dists >= 0))), len(log_sigmas) - 2)
    high_idx = low_idx + 1
    low, high = log_sigmas[low_idx], log_sigmas[high_idx]
    w = min(max((low - log_sigma) / (low - high), 0.0), 1.0)
    return (1 - w) * low_idx + w * high_idx


def t_to_sigma(t, model_sigmas):
    """k-diffusion ``DiscreteSchedule.t_to_sigma`` (ComfyUI ``ModelSamplingDiscrete.sigma`` also clamps t
    to [0, T-1]): log-sigma interpolated linearly between floor(t) and ceil(t)."""
    log_sigmas = np.log(np.asarray(model_sigmas, dtype=np.float64))
    t = np.clip(np.asarray(t, dtype=np.float64), 0, len(log_sigmas) - 1)
    low_idx, high_idx = np.floor(t).astype(int), np.ceil(t).astype(int)
    w = t - np.floor(t)
    return np.exp((1 - w) * log_sigmas[low_idx] + w * log_sigmas[high_idx])


def schedule(name: str, n: int, model_sigmas: np.ndarray) -> np.ndarray:
    """n + 1 sigmas, decreasing, ending with 0, for scheduler ``name`` (KeyError if unknown):

    * "normal": k-diffusion ``DiscreteSchedule.get_sigmas(n)``: t = linspace(T-1, 0, n), t_to_sigma.
    * "karras": k-diffusion ``get_sigmas_karras(n, sigma_min, sigma_max, rho=7.)``.
    * "exponential": k-diffusion ``get_sigmas_exponential(n, sigma_min, sigma_max)``.
    * "sgm_uniform": ComfyUI ``normal_scheduler(sgm=True)``: linspace(t(sigma_max), t(sigma_min), n+1)[:-1].
      (ComfyUI's ``timestep`` takes the nearest index; at sigma_max / sigma_min that equals sigma_to_t.)
    * "simple": ComfyUI ``simple_scheduler``: every (T/n)-th training sigma from the top.
    sigma_min / sigma_max are model_sigmas[0] / model_sigmas[-1].
    """
    ms = np.asarray(model_sigmas, dtype=np.float64)
    sigma_min, sigma_max = float(ms[0]), float(ms[-1])
    if name == "normal":
        sigmas = t_to_sigma(np.linspace(len(ms) - 1, 0, n), ms)
    elif name == "karras":
        rho = 7.0
        ramp = np.linspace(0, 1, n)
        min_inv_rho, max_inv_rho = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
        sigmas = (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho
    elif name == "exponential":
        sigmas = np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n))
    elif name == "sgm_uniform":
        start, end = sigma_to_t(sigma_max, ms), sigma_to_t(sigma_min, ms)
        sigmas = t_to_sigma(np.linspace(start, end, n + 1)[:-1], ms)
    elif name == "simple":
        ss = len(ms) / n
        sigmas = np.array([ms[-(1 + int(x * ss))] for x in range(n)])
    else:
        raise KeyError(name)
    return np.append(np.asarray(sigmas, dtype=np.float64), 0.0)
