"""Config values fuzzed with hypothesis: every combination either plans or fails with the one-line error.

The CLI composes the config and plans the run before anything loads (tests/test_bad_input.py
shows that path end to end); here the same two steps run in-process, so hundreds of inputs take
seconds. A failure must be an error ``describe`` turns into one line -- never an exception it
does not know (which the CLI would show as a traceback).
"""

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers.cli import assert_one_line_error, run_cli
from helpers.configs import compose_cfg
from helpers.mlflow_store import nothing_written
from sdjax_runner.config.messages import describe
from sdjax_runner.config.plan import Plan, admit, make_plan

pytestmark = pytest.mark.slow

KEYS = ["sampling.height", "sampling.width", "sampling.num_inference_steps", "sampling.guidance_scale",
        "parallelism.per_device_batch_size", "parallelism.num_devices", "parallelism.num_batches", "seed",
        "timing.repeats", "timing.max_extra_share", "output.grid_rows", "output.grid_cols", "model.resolution", "dtype.weights_dtype",
        "scheduler", "parallelism", "prompts.fill", "prompts.negative", "performance.attention",
        "model.prediction_type", "reuse.max_models", "scheduler.config_overrides.timestep_spacing",
        "sampling.num_inference_step", "prompts.texts", "compilation_cache.max_size_gb",
        "compilation_cache.min_compile_time_s"]
VALUES = st.one_of(
    st.integers(min_value=-10**15, max_value=10**15),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: "nan" if math.isnan(f) else repr(f)),
    st.text(max_size=24),
    st.sampled_from(["null", "true", "[]", "[a,b]", "{}", "'quoted'", "${seed}", "0x10", "1e999", "sharded",
                     "bfloat16", "v_prediction", "dot_product", "cudnn_flash", "pad"]),
)
OVERRIDES = st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(OVERRIDES)
@example([("prompts.texts", "${seed}")])  # found by this test: a whole list given as an interpolation
def test_any_values_plan_or_fail_with_one_line(pairs):
    overrides = ["+experiment=smoke"] + [f"{key}={value}" for key, value in pairs]
    try:
        plan = make_plan(admit(compose_cfg(overrides)), available_devices=8)
    except Exception as exc:
        message = describe(exc)
        assert message is not None, f"{overrides} raised {type(exc).__name__}: {exc}"
        assert message.strip() and "\n" not in message, overrides
    else:
        assert isinstance(plan, Plan) and plan.images and plan.num_batches >= 1


@pytest.mark.parametrize("override, key", [("prompts.texts=${seed}", "prompts.texts"),
                                           ("lora=${prompts.negative}", "lora")])
def test_a_list_given_as_an_interpolation_of_something_else_is_one_line(tmp_path, override, key):
    result = run_cli("+experiment=smoke", override, cwd=tmp_path)
    assert_one_line_error(result, f"error: {key}: must be a list, got ")
    assert nothing_written(tmp_path)
