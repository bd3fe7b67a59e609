"""UniPC (Zhao et al. 2023): a multistep predictor (UniP) and corrector (UniC) on the data prediction, one UNet
evaluation per step, in k-diffusion's sigma space (lambda = -log sigma; the data-prediction updates of a VP
model are the same there).

Step k evaluates x0 = D(x_k, sigma_k) at the predicted x_k; then, from step 1 on, UniC corrects x_k with that
evaluation (without evaluating again), and UniP predicts x_{k+1} from the corrected x_k and the last x0
estimates. As ComfyUI's ``sample_unipc`` (``uni_pc.py``, ``lower_order_final``): the order is at most
min(3, steps - 1), warms up from 1 and drops over the last moves, the last move is a first-order step with
no corrector, and a final sigma of 0 becomes 0.001 -- the sample there is the result. B(h) is h (bh1,
``uni_pc``) or e^h - 1 (bh2, ``uni_pc_bh2``). Every coefficient depends on the sigmas alone -- constants
of the program -- so they are solved on the host (NumPy) and the traced loop only forms linear combinations.
"""

from __future__ import annotations

import math

import numpy as np

from sdjax_runner.engine.samplers.starts import per_start

DEPTH = 3  # the most x0 estimates an update reaches back to (order 3)
FINAL_SIGMA = 0.001  # ComfyUI's sample_unipc steps to this in place of a final 0


def _update(lambdas: np.ndarray, s0: int, t_lambda: float, order: int, variant: str, corrector: bool):
    """(weight on x at s0, weights on the x0 estimates at s0, s0-1, ..., and for UniC the weight on the new
    estimate at t) of one UniP (or UniC) update from step ``s0`` to the point with lambda ``t_lambda``."""
    h = t_lambda - lambdas[s0]
    hh = -h  # data prediction
    h_phi_1 = math.expm1(hh)
    b_h = hh if variant == "bh1" else h_phi_1
    rks = [(lambdas[s0 - i] - lambdas[s0]) / h for i in range(1, order)] + [1.0]
    row_list, rhs_list = [], []
    h_phi_k, factorial = h_phi_1 / hh - 1, 1
    for i in range(1, order + 1):
        row_list.append(np.power(rks, i - 1))
        rhs_list.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    rows, rhs = np.array(row_list), np.array(rhs_list)
    if corrector:
        rhos = np.array([0.5]) if order == 1 else np.linalg.solve(rows, rhs)
    else:
        rhos = np.array([0.5]) if order == 2 else np.linalg.solve(rows[:-1, :-1], rhs[:-1]) if order > 2 else np.array([])
    weights = np.zeros(DEPTH + 1)  # on the estimates at s0, s0-1, s0-2, s0-3
    weights[0] = -h_phi_1
    for i in range(1, order):  # D1_i = (m_{s0-i} - m_s0) / r_i
        weights[i] -= b_h * rhos[i - 1] / rks[i - 1]
        weights[0] += b_h * rhos[i - 1] / rks[i - 1]
    new = 0.0
    if corrector:  # D1_t = m_t - m_s0, weighted by the last rho
        new = -b_h * rhos[-1]
        weights[0] += b_h * rhos[-1]
    return math.exp(-h), weights, new  # sigma_t / sigma_s0 = e^(-h)


def coefficients(sigmas: np.ndarray, order: int, variant: str):
    """Per step k (of len(sigmas) - 1): the predictor's (a, weights on m_k, m_k-1, m_k-2) and, from step 1,
    the corrector's (a, weights on m_k-1, m_k-2, m_k-3, then the new m_k); ``sigmas`` as stepped (no 0)."""
    sigmas = np.asarray(sigmas, np.float64)
    steps = len(sigmas) - 1
    lambdas = -np.log(sigmas)
    order = min(order, steps - 1)
    predict = np.zeros((steps, 1 + DEPTH))
    correct = np.zeros((steps, 2 + DEPTH))
    orders = [min(k + 1, order, steps - k) for k in range(steps)]  # of the move from step k to k + 1
    for k in range(steps):
        if k > 0:  # UniC on x_k, with the order of the move that predicted it
            a, weights, new = _update(lambdas, k - 1, lambdas[k], orders[k - 1], variant, corrector=True)
            correct[k] = [a, *weights[:DEPTH], new]
        a, weights, _ = _update(lambdas, k, lambdas[k + 1], orders[k], variant, corrector=False)
        predict[k] = [a, *weights[:DEPTH]]
    return predict, correct


def sampler(order: int, variant: str):
    def unipc(model, x, sigmas, noise, start=0):
        """From step ``start`` (k_samplers.py): the coefficients of a run on ``sigmas[start:]``."""
        import jax
        import jax.numpy as jnp

        sigmas = np.asarray(sigmas, np.float64)
        if len(sigmas) < 3:
            raise ValueError("UniPC takes at least 2 steps")  # config/samplers.py refuses fewer first
        if sigmas[-1] == 0:
            sigmas = np.append(sigmas[:-1], FINAL_SIGMA)
        predict, correct = (jnp.asarray(per_start(lambda s, part=part: coefficients(s, order, variant)[part], sigmas,
                                                  start), x.dtype) for part in (0, 1))
        constants = jnp.asarray(sigmas, x.dtype)

        def step(k, carry):
            x, last, history = carry  # history: the x0 estimates of steps k-1, k-2, k-3
            m = model(x, constants[k])
            c = correct[start, k]
            corrected = c[0] * last + jnp.tensordot(c[1:1 + DEPTH], history, axes=1) + c[-1] * m
            x = jnp.where(k > start, corrected, x)
            history = jnp.concatenate([m[None], history[:-1]])
            p = predict[start, k]
            return p[0] * x + jnp.tensordot(p[1:], history, axes=1), x, history

        carry = (x, x, jnp.zeros((DEPTH,) + x.shape, x.dtype))
        return jax.lax.fori_loop(start, len(sigmas) - 1, step, carry)[0]

    return unipc
