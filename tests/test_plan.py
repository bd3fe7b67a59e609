"""The plan: how prompts, devices, batches and the grid are laid out (no model involved)."""

import pytest
from hydra import compose, initialize_config_dir

from helpers.configs import CONF
from sdjax_runner.config import schema
from sdjax_runner.config.plan import admit, make_plan
from sdjax_runner.errors import UserError
from sdjax_runner.record.rundir import grid_shape


def plan_for(*overrides, devices=8):
    schema.register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=smoke", *overrides])
    return make_plan(admit(cfg), available_devices=devices)


def test_one_prompt_fills_every_device_like_the_guide():
    plan = plan_for()
    assert plan.num_batches == 1 and len(plan.images) == 8
    assert [(s.device, s.slot) for s in plan.images] == [(d, 0) for d in range(8)]
    assert len({s.prompt for s in plan.images}) == 1 and all(s.kept for s in plan.images)


def test_more_prompts_than_a_batch_are_split_across_batches():
    plan = plan_for("prompts=guide_eight", "parallelism.num_devices=2", "parallelism.per_device_batch_size=2")
    assert plan.images_per_batch == 4 and plan.num_batches == 2
    assert plan.batch_prompts(1) == list(plan.prompts[4:8])
    assert [(s.batch, s.device, s.slot) for s in plan.images[:5]] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0)]


def test_cycle_keeps_fillers_and_pad_drops_them():
    cycled = plan_for("prompts.texts=[a,b,c]", "parallelism.num_devices=4")
    padded = plan_for("prompts.texts=[a,b,c]", "parallelism.num_devices=4", "prompts.fill=pad")
    assert [s.prompt for s in cycled.images] == ["a", "b", "c", "a"]
    assert [s.prompt for s in padded.kept_images] == ["a", "b", "c"]
    assert len(padded.images) == 4  # the filler is still generated, so shapes stay static


def test_explicit_batches_repeat_the_prompt_list():
    plan = plan_for("prompts=guide_eight", "parallelism.num_batches=2")
    assert len(plan.kept_images) == 16 and plan.batch_prompts(0) == plan.batch_prompts(1)


def test_too_few_batches_for_the_prompts_is_an_error():
    with pytest.raises(UserError, match=r"parallelism.num_batches: 1 batch\(es\) of 4 cannot hold 8 prompts"):
        plan_for("prompts=guide_eight", "parallelism.num_devices=4", "parallelism.num_batches=1")


def test_grid_too_small_is_an_error():
    with pytest.raises(UserError, match=r"output.grid_rows: a 2 x 2 grid cannot hold 8 images"):
        plan_for("output.grid_rows=2", "output.grid_cols=2")


@pytest.mark.parametrize("count,shape", [(8, (2, 4)), (1, (1, 1)), (16, (4, 4)), (6, (2, 3)), (3, (1, 3)),
                                         (97, (10, 10))])
def test_default_grid_shape(count, shape):
    assert grid_shape(count) == shape


def test_grid_shape_from_one_side():
    assert grid_shape(8, rows=1) == (1, 8) and grid_shape(8, cols=3) == (3, 3)


def test_prompt_file_adds_one_prompt_per_nonblank_line(tmp_path):
    file = tmp_path / "prompts.txt"
    file.write_text("a red car\n\n  blue sky  \n", encoding="utf-8")
    plan = plan_for(f"prompts.file={file}", "prompts.texts=[first]", "parallelism.num_devices=3")
    assert plan.prompts == ("first", "a red car", "blue sky") and plan.num_batches == 1


def test_prompt_file_that_is_not_utf8_is_an_error(tmp_path):
    file = tmp_path / "prompts.txt"
    file.write_bytes(b"ok\n\xff\xfe bad\n")
    with pytest.raises(UserError, match=r"prompts.file: .* is not valid UTF-8 \(byte 3\)"):
        plan_for(f"prompts.file={file}")


@pytest.mark.slow  # builds the tiny model for its tokenizer
def test_prompts_longer_than_clip_reads_are_named_with_what_is_dropped(tiny_model_dir, caplog):
    from transformers import CLIPTokenizer

    from sdjax_runner.config.prompts import warn_truncated

    tokenizer = CLIPTokenizer.from_pretrained(tiny_model_dir / "tokenizer")
    long = " ".join(["a red car on a blue street"] * 14)
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        warn_truncated(tokenizer, ("short one", long, "short one"))
    [record] = caplog.records
    dropped = len(tokenizer(long).input_ids) - 77
    assert dropped > 0
    assert record.getMessage().startswith(f"prompt 2 of 2 has {77 + dropped} tokens; the text encoder reads 77, "
                                          f"so the last {dropped} are dropped")
