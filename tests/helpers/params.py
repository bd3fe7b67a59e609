"""Comparing two models' weight trees."""

from __future__ import annotations

import numpy as np


def assert_same_params(a, b):
    """Same leaves, dtypes and values, exactly."""
    from flax.traverse_util import flatten_dict

    flat_a, flat_b = flatten_dict(a), flatten_dict(b)
    assert flat_a.keys() == flat_b.keys()
    for key in flat_a:
        assert flat_a[key].dtype == flat_b[key].dtype and np.array_equal(flat_a[key], flat_b[key]), key
