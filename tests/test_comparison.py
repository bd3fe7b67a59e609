"""metrics/comparison.py on records made here (no model): which swept keys are replicates, how the baseline is
chosen, what is paired, and what a setting without pairs or with values that are not finite reads as. A sweep's
comparison.json against its images' records and SciPy's bootstrap: tests/test_report.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sdjax_runner.metrics.comparison import baseline_of, compare, estimate, paired, settings_of
from sdjax_runner.records import ImageRecord


def _records(seed: int, scores: list[float], prompt: str = "a cat", psnr=None) -> list[ImageRecord]:
    return [ImageRecord(index=i, seed=seed, prompt=prompt, clip_score=s, psnr=None if psnr is None else psnr[i])
            for i, s in enumerate(scores)]


def test_seeds_and_prompts_are_replicates_and_the_reference_point_picks_the_baseline():
    keys = ["sampler", "seed", "prompts.texts"]
    points = [(job, {"sampler": sampler, "seed": str(seed), "prompts.texts": prompt}, _records(seed, [1.0, 2.0], prompt))
              for job, (sampler, seed, prompt) in enumerate(
                  (s, seed, p) for s in ("Euler", "DPM++ 2M") for seed in (0, 1) for p in ("['a']", "['b']"))]
    settings = settings_of(points, keys)
    assert [s.label for s in settings] == ["sampler=Euler", "sampler=DPM++ 2M"]
    assert [s.jobs for s in settings] == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(settings[0].records) == 8
    assert baseline_of(settings, None) == (0, "the first setting")
    assert baseline_of(settings, {"sampler": "dpmpp_2m"}) == (1, "metrics.reference_point")  # as A1111 spells it
    assert baseline_of(settings, {"seed": "1"}) == (0, "the first setting")  # a replicate names no setting
    only_seeds = settings_of(points[:2], ["seed"])
    assert [s.label for s in only_seeds] == ["all points"]


def test_pairs_are_the_same_seed_index_and_prompt_and_what_has_none_says_so():
    baseline = _records(0, [1.0, 2.0, 3.0]) + _records(1, [1.0, 1.0, 1.0])
    better = _records(0, [1.5, 2.5, 3.0]) + _records(1, [2.0, 0.0, 1.0])
    other_seeds = _records(7, [9.0, 9.0, 9.0])
    points = [(0, {"x": "a"}, baseline), (1, {"x": "b"}, better), (2, {"x": "c"}, other_seeds)]
    judged = compare(settings_of(points, ["x"]), 0, "the first setting")
    json.dumps(judged, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere
    a, b, c = judged["settings"]
    assert a["baseline"] and "versus_baseline" not in a
    versus = b["versus_baseline"]["clip_score"]
    differences = np.array([0.5, 0.5, 0.0, 1.0, -1.0, 0.0])
    assert b["pairs"] == versus["n"] == 6 and versus["mean"] == pytest.approx(differences.mean())
    assert (versus["higher"], versus["ties"], versus["lower"]) == (3, 2, 1)
    assert versus["win_rate"] == pytest.approx((3 + 0.5 * 2) / 6)
    assert versus["low"] <= versus["mean"] <= versus["high"] and versus["holds_zero"] is (versus["low"] <= 0)
    assert c["pairs"] == 0 and c["versus_baseline"] == {}  # no image of seed 7 in the baseline
    assert c["metrics"]["clip_score"] == {"n": 3, "mean": 9.0, "low": 9.0, "high": 9.0, "left_out": 0}


def test_values_that_are_not_finite_are_left_out_and_counted():
    found = estimate([1.0, math.inf, 3.0])
    assert (found.n, found.mean, found.left_out) == (2, 2.0, 1)
    assert estimate([math.inf]).to_json() == {"n": 0, "mean": None, "low": None, "high": None, "left_out": 1}
    compared = paired("psnr", [(math.inf, 40.0), (30.0, 32.0), (30.0, 31.0)])
    assert (compared.n, compared.left_out, compared.mean) == (2, 1, 1.5)
    assert compared.holds_zero is False and compared.low >= 1.0  # both pairs higher: the interval is above 0
    assert paired("psnr", [(math.inf, math.inf)]).to_json()["win_rate"] is None
