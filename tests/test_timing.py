"""What the steady-state timing costs and says: re-runs of batch 0 bounded by timing.max_extra_share (none
allowed: the figure is the first call's and says so), exact medians on request, and a run with batches
enough timing its own. The smoke run's own record: tests/test_smoke_run.py."""

from __future__ import annotations

import json

import pytest

from helpers.cli import run_cli
from sdjax_runner.engine.generate import extra_call_affordable


def generate_line(stdout: str) -> str:
    [line] = [line for line in stdout.splitlines() if "] generate: " in line]
    return line


def run(tmp_path, *overrides: str) -> tuple[dict, str]:
    result = run_cli("+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", *overrides,
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "run" / "timings.json").read_text()), generate_line(result.stdout)


@pytest.mark.slow
def test_exact_medians_on_request_rerun_batch_0_as_before(tmp_path, tiny_model_dir):
    timings, line = run(tmp_path, "timing.repeats=3", "timing.max_extra_share=null")
    assert (timings["steady_calls"], timings["timing_extra_calls"]) == (3, 3)
    assert timings["generate_s_from"] == "steady_median"
    assert timings["generate_s_min"] <= timings["generate_s"] <= timings["generate_s_max"]
    assert timings["timing_extra_s"] >= 3 * timings["generate_s_min"]
    assert f" generate: {timings['generate_s']:.3f} s/batch median of 3 (min {timings['generate_s_min']:.3f}, max " \
           f"{timings['generate_s_max']:.3f}), " in line


@pytest.mark.slow
def test_a_run_of_four_batches_times_its_own_and_reruns_nothing(tmp_path, tiny_model_dir):
    timings, line = run(tmp_path, "parallelism.num_batches=4", "output.save_images=false")
    assert (timings["num_batches"], timings["steady_calls"], timings["timing_extra_calls"]) == (4, 3, 0)
    assert timings["timing_extra_s"] == 0 and timings["generate_s_from"] == "steady_median"
    assert " s/batch median of 3 (min " in line and "max_extra_share" not in line


@pytest.mark.slow
def test_no_rerun_allowed_leaves_the_first_calls_figure_said_as_such(tmp_path, tiny_model_dir):
    timings, line = run(tmp_path, "timing.max_extra_share=0")
    assert (timings["steady_calls"], timings["timing_extra_calls"], timings["timing_extra_s"]) == (0, 0, 0)
    assert timings["generate_s_from"] == "first_call"
    assert timings["generate_s"] == timings["generate_s_min"] == timings["generate_s_max"] == timings["first_batch_s"]
    assert timings["images_per_s"] == 8 / timings["first_batch_s"]
    assert (f" generate: {timings['first_batch_s']:.3f} s/batch from the first call alone (no steady-state call: one "
            f"would cost over timing.max_extra_share=0 of the job's {timings['timing_base_s']:.3g} s so far; "
            f"timing.max_extra_share=null for a median of 3), {timings['images_per_s']:.2f} images/s") in line


def test_the_bound_weighs_the_next_call_against_the_jobs_cost_so_far():
    # An A1111 PNG of 512x768 on a CPU: a 90 s batch after 12 s of load and compile. Before, three re-runs
    # (270 s more); now none at 0.5, one where the share allows a whole batch, all three without a bound.
    assert not extra_call_affordable(0.0, 90.0, 102.0, 0.5)
    assert extra_call_affordable(0.0, 90.0, 102.0, 1.0) and not extra_call_affordable(90.0, 90.0, 102.0, 1.0)
    assert extra_call_affordable(180.0, 90.0, 102.0, None)
    assert not extra_call_affordable(0.0, 0.1, 10.0, 0.0)  # 0: never a re-run
    # The smoke run: 0.07 s batches after 4 s of load and compile: all three re-runs fit in half of it.
    assert all(extra_call_affordable(0.07 * n, 0.07, 4.0, 0.5) for n in range(3))
