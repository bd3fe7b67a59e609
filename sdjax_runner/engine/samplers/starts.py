"""Host coefficients of the multistep samplers (LMS, UniPC) for a run that starts part-way down the schedule."""

from __future__ import annotations

import numpy as np


def per_start(table, sigmas, start, *args) -> np.ndarray:
    """``table(sigmas[s:], *args)`` (per-step host coefficients) for every start s a run may take, stacked
    as [s, step] with the steps at their place in ``sigmas`` (rows before s unused): the coefficients of a
    run from ``start`` are those of a run on ``sigmas[start:]``. One start (0) when ``start`` is the
    number 0 (text to image)."""
    steps = len(sigmas) - 1
    starts = [0] if isinstance(start, int) and start == 0 else range(steps)
    first = np.asarray(table(np.asarray(sigmas)[0:], *args))
    out = np.zeros((len(starts),) + first.shape, first.dtype)
    for s in starts:
        if steps - s >= 1:
            try:
                out[s, s:] = table(np.asarray(sigmas)[s:], *args)
            except (ValueError, np.linalg.LinAlgError):  # too few steps left for this sampler: never started at
                pass
    return out
