"""The typed records (sdjax_runner/records.py): images.json's image records, timings.json and quality.json read and
written through one module, the JSON on disk as it always was -- a record of an older version read and written
back loses nothing -- and the plan's LoRA and checkpoint entries as named tuples."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from PIL import Image

from sdjax_runner.config.plan import CheckpointEntry, LoraEntry
from sdjax_runner.records import ImageRecord, Quality, RunTimings, required

# The keys of a smoke run's records, as the runner wrote them before they were typed (images.json: every image's).
SMOKE_IMAGE_KEYS = ["batch", "clip_score", "device", "dtype", "file", "guidance_scale", "height", "index", "mode",
                    "model", "model_path", "negative_prompt", "non_finite", "pixels_sha256", "prompt", "sampler",
                    "scheduler", "seed", "steps", "width"]
SMOKE_TIMINGS_KEYS = [
    "backend", "compile_cache_hit", "compile_path", "compile_reused", "compile_s", "denoiser_param_bytes_per_device",
    "device_kind", "device_memory_peak_bytes", "devices", "executable_cache_hit", "first_batch_s", "flops_per_batch",
    "generate_s",
    "generate_s_from", "generate_s_max", "generate_s_min", "host", "host_peak_rss_bytes", "images_per_batch",
    "images_per_s", "load_s", "mfu", "model_reused", "num_batches", "num_devices", "num_images",
    "param_bytes_per_device", "peak_tflops_per_device", "per_device_batch_size", "pid", "process_compiles",
    "process_count", "process_model_loads", "process_models_held", "program_memory_bytes", "replicate_s", "s_per_step",
    "steady_calls", "tflops_per_s", "timing_base_s", "timing_extra_calls", "timing_extra_s", "trace_s", "wall_s",
    "worker", "write_s"]
SMOKE_QUALITY_KEYS = ["clip_model", "clip_score_compile_path", "clip_score_mean", "clip_score_s", "clip_score_std",
                      "metrics_s", "non_finite_images"]
# What the image's PNG text chunks hold, in the order written (the record but its quality; then A1111's text, with
# the metrics' values added before IEND once they are in).
SMOKE_PNG_CHUNKS = ["negative_prompt", "seed", "steps", "guidance_scale", "scheduler", "sampler", "mode", "model",
                    "model_path", "dtype", "height", "width", "index", "batch", "device", "prompt", "file",
                    "pixels_sha256", "non_finite", "parameters", "clip_score"]


def _filled(cls, skip=()):
    """An instance of ``cls`` with every field set to a value of its kind, and an unknown key in ``extra``."""
    values = {}
    for number, f in enumerate(dataclasses.fields(cls)):
        if f.name in ("extra", "read_keys") or f.name in skip:
            continue
        kind = str(f.type)
        values[f.name] = (number % 2 == 0 if "bool" in kind else number if "int" in kind
                          else number + 0.5 if "float" in kind else f"text {number}")
    return cls(**values, extra={"from_a_later_version": {"kept": [1, 2]}})


@pytest.mark.parametrize("cls", [ImageRecord, RunTimings, Quality])
def test_each_record_goes_through_its_json_and_back_unchanged(cls):
    record = _filled(cls)
    data = record.to_json()
    assert list(data) == [*cls.json_keys(), "from_a_later_version"]  # every field, in order, then what it kept
    assert json.loads(json.dumps(data)) == data
    again = cls.from_json(json.loads(json.dumps(data)))
    assert again == record and again.to_json() == data
    empty = cls()
    assert cls.from_json(empty.to_json()) == empty


def test_a_record_made_here_writes_what_has_a_value_and_the_nulls_a_complete_run_writes():
    assert ImageRecord(seed=0, prompt="a cat").to_json() == {"negative_prompt": None, "seed": 0, "prompt": "a cat"}
    assert Quality(psnr=math.inf).to_json() == {"psnr": math.inf}
    # A complete run's timings: every field, null where not measured (mfu without a known peak); a partial run's
    # two keys only where they are set.
    assert sorted(RunTimings().to_json()) == SMOKE_TIMINGS_KEYS
    assert RunTimings(partial=1).to_json()["partial"] == 1 and "batches_done" not in RunTimings().to_json()


def test_an_older_record_reads_with_defaults_and_writes_back_what_it_held():
    # images.json before pixel hashes, generation modes and overflow checks, with a key this version never wrote.
    old_image = {"file": "images/0000_seed0.png", "prompt": "a cat", "seed": 0, "index": 0, "steps": 4,
                 "scheduler": "pndm", "negative_prompt": None, "eta": None, "legacy_note": "kept"}
    record = ImageRecord.from_json(old_image)
    assert (record.prompt, record.index, record.eta) == ("a cat", 0, None)
    assert record.pixels_sha256 is None and record.non_finite is None and record.mode is None
    assert record.extra == {"legacy_note": "kept"}
    assert record.to_json() == old_image  # no key added, the null kept, the unknown key written back
    record.clip_score = 30.5
    assert record.to_json() == dict(old_image, clip_score=30.5)
    with pytest.raises(KeyError, match="pixels_sha256"):
        required(record.pixels_sha256, "pixels_sha256")

    # timings.json of a run made before steady_calls (steady_state_samples), timing re-runs and warm starts.
    old_timings = {"compile_s": 5.1, "generate_s": 0.07, "steady_state_samples": 3, "num_images": 8,
                   "mfu": None, "device_kind": "cpu"}
    timings = RunTimings.from_json(old_timings)
    assert (timings.compile_s, timings.steady_calls, timings.compile_path) == (5.1, None, None)
    assert timings.extra == {"steady_state_samples": 3} and timings.to_json() == old_timings

    old_quality = {"clip_score_mean": 21.0, "clip_model": "openai/clip-vit-base-patch32", "fid": 12.5}
    quality = Quality.from_json(old_quality)
    assert quality.clip_score_mean == 21.0 and quality.non_finite_images is None and quality.extra == {"fid": 12.5}
    assert quality.to_json() == old_quality
    # A comparison added to it later (a sweep's reference point): the old keys kept, the new ones added.
    merged = quality.updated(Quality(reference="/runs/0", psnr=math.inf, reference_label="dtype=fp32"))
    assert merged.to_json() == dict(old_quality, reference="/runs/0", psnr=math.inf, reference_label="dtype=fp32")


def test_keys_of_the_record_never_clash_with_the_records_own_fields():
    crafted = {"extra": "not the extra dict", "read_keys": ["x"], "prompt": "a cat"}
    record = ImageRecord.from_json(crafted)
    assert record.extra == {"extra": "not the extra dict", "read_keys": ["x"]} and record.to_json() == crafted


def test_png_text_reads_back_as_the_record():
    chunks = {"negative_prompt": "", "seed": "3", "guidance_scale": "7.5", "index": "2", "non_finite": "False",
              "prompt": "a cat", "eta": "0.0", "file": "images/0002_seed3.png", "unknown_chunk": "x"}
    record = ImageRecord.from_text(chunks)
    assert (record.negative_prompt, record.seed, record.guidance_scale, record.index, record.non_finite,
            record.eta) == (None, 3, 7.5, 2, False, 0.0)
    assert record.extra == {"unknown_chunk": "x"}
    with pytest.raises(ValueError):
        ImageRecord.from_text({"seed": "three"})


def test_lora_and_checkpoint_entries_are_named_and_still_unpack():
    adapter = LoraEntry("/x/style.safetensors", 0.8, "ab" * 32)
    path, scale, sha = adapter
    assert (adapter.path, adapter.scale, adapter.sha256) == (path, scale, sha)
    checkpoint = CheckpointEntry("/x/tiny.safetensors", "cd" * 32, "sd1")
    assert (checkpoint.path, checkpoint.sha256, checkpoint.architecture) == tuple(checkpoint)
    assert hash(checkpoint) == hash(tuple(checkpoint))  # a reuse key holding it keys as the plain tuple did


def test_job_finish_writes_the_records_json(tmp_path):
    from sdjax_runner.record.job import Job

    timings = {**dict.fromkeys(SMOKE_TIMINGS_KEYS), "generate_s": 0.5, "num_images": 8}
    quality = {"clip_score_mean": 20.0, "metrics_s": 0.1, "non_finite_images": 0}
    Job(tmp_path).finish(RunTimings.from_json(timings), Quality.from_json(quality))
    assert json.loads((tmp_path / "timings.json").read_text()) == timings
    assert json.loads((tmp_path / "quality.json").read_text()) == quality


def test_a_fresh_runs_records_have_the_keys_they_always_had(smoke_run):
    _, run_dir, _ = smoke_run
    images = json.loads((run_dir / "images.json").read_text())
    timings = json.loads((run_dir / "timings.json").read_text())
    quality = json.loads((run_dir / "quality.json").read_text())
    assert len(images) == 8 and all(sorted(image) == SMOKE_IMAGE_KEYS for image in images)
    assert sorted(timings) == SMOKE_TIMINGS_KEYS
    assert sorted(quality) == SMOKE_QUALITY_KEYS
    # Read and written back through the records: the same JSON, nothing extra.
    for cls, data in [*((ImageRecord, image) for image in images), (RunTimings, timings), (Quality, quality)]:
        record = cls.from_json(data)
        assert record.to_json() == data and record.extra == {}
    with Image.open(run_dir / images[0]["file"]) as png:
        assert list(png.text) == SMOKE_PNG_CHUNKS
