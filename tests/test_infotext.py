"""A1111 infotext in and out: our PNGs' ``parameters`` read back by A1111's own parsing rules, A1111's
published example read as A1111 reads it, and ``python -m sdjax_runner from_png`` remaking a run's images
from one of its PNGs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from helpers.cli import assert_one_line_error, run_cli
from helpers.configs import compose_cfg
from helpers.images import images_of
from sdjax_runner.config import infotext
from sdjax_runner.config.overrides import literal
from sdjax_runner.metrics.registry import METRICS
from sdjax_runner.record.rundir import pixel_hash, with_texts

# A1111's published docstring example (modules/infotext_utils.py, parse_generation_parameters).
A1111_EXAMPLE = """girl with an artist's beret, determined, blue eyes, desert scene, computer monitors, heavy makeup, by Alphonse Mucha and Charlie Bowater, ((eyeshadow)), (coquettish), detailed, intricate
Negative prompt: ugly, fat, obese, chubby, (((deformed))), [blurry], bad anatomy, disfigured, poorly drawn face, mutation, mutated, (extra_limb), (ugly), (poorly drawn hands), messy drawing
Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 965400086, Size: 512x512, Model hash: 45dee52b"""
# A1111's patterns, copied from the same file: a copy of its published format, to read our PNGs with.
A1111_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')


def test_a1111s_example_reads_as_a1111_reads_it_and_becomes_overrides():
    info = infotext.parse(A1111_EXAMPLE)
    assert info.prompt.startswith("girl with an artist's beret") and info.prompt.endswith("detailed, intricate")
    assert info.negative.startswith("ugly, fat") and info.negative.endswith("messy drawing")
    assert info.settings == {"Steps": "20", "Sampler": "Euler a", "CFG scale": "7", "Seed": "965400086",
                             "Size": "512x512", "Model hash": "45dee52b"}
    out = infotext.overrides(info, ("tiny-random",), ("fp32",), has_init_image=False)
    assert {"sampling.num_inference_steps=20", "sampler='Euler a'", "sampling.guidance_scale=7.0", "seed=965400086",
            "sampling.width=512", "sampling.height=512", "prompts.syntax=a1111"} <= set(out.overrides)
    assert out.not_honoured == ["Model hash: 45dee52b: models are not found by hash here; pick one with model=NAME"]
    cfg = compose_cfg(out.overrides)  # every override composes, the prompts exactly as written
    assert list(cfg.prompts.texts) == [info.prompt] and cfg.prompts.negative == info.negative


@pytest.mark.parametrize("prompt", ["a 'quoted' cat", 'say "hi", twice', r"escaped \(paren\) and a \\", "ends in \\",
                                    "${oc.env:HOME} is not resolved", "\\${oc.env:HOME} neither", "\\\\${oc.env:HOME}",
                                    "[list, like], {braces: 1}", "a\nsecond line"])
def test_prompts_pass_through_hydra_unchanged(prompt):
    cfg = compose_cfg([f"prompts.texts=[{literal(prompt)}]", f"prompts.negative={literal(prompt)}"])
    assert list(cfg.prompts.texts) == [prompt] and cfg.prompts.negative == prompt


@pytest.mark.slow
def test_our_pngs_infotext_reads_back_with_a1111s_rules(smoke_run):
    _, run_dir, _ = smoke_run
    png = sorted((run_dir / "images").glob("*.png"))[0]
    with Image.open(png) as image:
        text, chunks = image.text["parameters"], dict(image.text)
    *lines, last = text.strip().split("\n")
    settings = dict(A1111_PARAM.findall(last))
    assert len(settings) >= 3  # A1111 takes the last line for settings only then
    assert lines[0] == chunks["prompt"]
    assert (settings["Steps"], settings["Seed"], settings["CFG scale"]) == (chunks["steps"], chunks["seed"],
                                                                           chunks["guidance_scale"])
    assert settings["Size"] == f"{chunks['width']}x{chunks['height']}"
    # The metrics' values, once they were in: last on the line, under the registry's keys, as images.json has them;
    # the PNG's own chunk too; the pixels as written (the chunks were copied, not the image encoded again).
    record = next(r for r in json.loads((run_dir / "images.json").read_text()) if r["file"] == f"images/{png.name}")
    assert list(settings)[-1] == METRICS["clip_score"].infotext
    assert settings["CLIP score"] == METRICS["clip_score"].shown.format(record["clip_score"])
    assert float(chunks["clip_score"]) == record["clip_score"]
    with Image.open(png) as image:
        image.verify()  # every chunk's CRC
    assert pixel_hash(np.asarray(Image.open(png))) == record["pixels_sha256"]


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks as (type, data), read by the format's own layout (a reference apart from record/rundir.py)."""
    import struct

    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        chunks.append((data[at + 4:at + 8], data[at + 8:at + 8 + length]))
        at += 12 + length
    return chunks


def test_a_pngs_texts_are_replaced_and_added_and_everything_else_is_kept_byte_for_byte(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    info = PngInfo()
    info.add_itxt("prompt", "a cat")
    info.add_itxt("clip_score", "")
    info.add_text("parameters", "a cat\nSteps: 4")
    info.add_text("parameters", "a second one, as a broken tool might write")
    Image.fromarray(pixels).save(tmp_path / "a.png", pnginfo=info)
    original = (tmp_path / "a.png").read_bytes()

    stamped = with_texts(original, {"clip_score": "31.25", "parameters": "a cat\nSteps: 4, CLIP score: 31.25",
                                    "psnr": "inf", "prompt": "ein Kätzchen ✓"})
    (tmp_path / "b.png").write_bytes(stamped)
    with Image.open(tmp_path / "b.png") as image:
        image.verify()
    with Image.open(tmp_path / "b.png") as image:
        assert image.text == {"prompt": "ein Kätzchen ✓", "clip_score": "31.25", "psnr": "inf",
                              "parameters": "a cat\nSteps: 4, CLIP score: 31.25"}
        assert np.array_equal(np.asarray(image), pixels)
    texts = (b"iTXt", b"tEXt", b"zTXt")
    assert [c for c in png_chunks(stamped) if c[0] not in texts] == [c for c in png_chunks(original) if c[0] not in texts]
    assert png_chunks(stamped)[-1] == (b"IEND", b"")
    for broken in (original[:-6], b"GIF89a" + original[6:]):
        with pytest.raises(ValueError):
            with_texts(broken, {"psnr": "1"})


@pytest.mark.slow
def test_from_png_remakes_the_runs_images(smoke_run, tmp_path):
    _, run_dir, _ = smoke_run
    png = sorted((run_dir / "images").glob("*.png"))[0]
    result = run_cli(str(png), "+experiment=smoke", "tracking=none", f"hydra.run.dir={tmp_path / 'again'}",
                     cwd=tmp_path, command="from_png")
    assert result.returncode == 0, result.stderr
    assert "from_png: Steps: 4 -> sampling.num_inference_steps=4" in result.stderr
    # Read with A1111's syntax (ours escapes a plain prompt's brackets): the same encoding for a plain prompt.
    assert "from_png: Prompt: A1111's syntax -> prompts.syntax=a1111" in result.stderr
    # The CLIP score the PNG carries is said as a measurement and becomes no override.
    measured = [line for line in result.stderr.splitlines() if "CLIP score" in line]
    assert len(measured) == 1 and measured[0].startswith("from_png: measured, not a setting: CLIP score: ")
    for mine, theirs in zip(images_of(tmp_path / "again"), images_of(run_dir), strict=True):
        assert np.array_equal(mine, theirs)


@pytest.mark.slow
def test_from_png_of_a_size_far_past_the_models_says_once_it_is_slow_on_a_cpu_and_what_to_set(tmp_path,
                                                                                              tiny_model_dir):
    """An A1111 PNG's size far past the model's native one (here 6x the tiny model's 64x64 pixels; 512x768
    is 96x) runs on a CPU, slowly: one line says so and which sampling.width/height keep its shape at about
    the native size; given at the end of the command, they win and the line is gone."""
    info = PngInfo()
    info.add_text("parameters", "a red car\nSteps: 4, CFG scale: 7, Seed: 1, Size: 128x192")
    Image.new("RGB", (128, 192)).save(tmp_path / "a1111.png", pnginfo=info)
    result = run_cli(str(tmp_path / "a1111.png"), "+experiment=smoke", "tracking=none",
                     f"hydra.run.dir={tmp_path / 'big'}", cwd=tmp_path, command="from_png")
    assert result.returncode == 0, result.stderr
    assert "from_png: Size: 128x192 -> sampling.width=128 sampling.height=192" in result.stderr
    said = [line for line in result.stdout.splitlines() if "] size: " in line]
    assert len(said) == 1 and said[0].endswith(
        "] size: 128x192 is 6x the pixels of tiny-random's native 64x64, on a CPU: this run will be slow; "
        "sampling.width=48 sampling.height=80 at the end of the command keeps its shape at about the native size")
    assert images_of(tmp_path / "big")[0].shape == (192, 128, 3)
    again = run_cli(str(tmp_path / "a1111.png"), "+experiment=smoke", "tracking=none",
                    f"hydra.run.dir={tmp_path / 'fit'}", "sampling.width=48", "sampling.height=80", cwd=tmp_path,
                    command="from_png")
    assert again.returncode == 0, again.stderr
    assert "] size: " not in again.stdout and images_of(tmp_path / "fit")[0].shape == (80, 48, 3)


def test_from_png_of_a_file_without_infotext_is_one_line(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "plain.png")
    (tmp_path / "notes.png").write_text("not an image")
    assert_one_line_error(run_cli(str(tmp_path / "plain.png"), cwd=tmp_path, command="from_png"),
                          f"error: IMAGE: {tmp_path / 'plain.png'} carries no A1111 'parameters' text")
    assert_one_line_error(run_cli(str(tmp_path / "notes.png"), cwd=tmp_path, command="from_png"),
                          f"error: IMAGE: {tmp_path / 'notes.png'} cannot be read as an image")


def test_denoising_strength_is_used_with_an_init_image_and_said_otherwise():
    info = infotext.parse("a cat\nSteps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 5, "
                          "Denoising strength: 0.45, Clip skip: 2")
    used = infotext.overrides(info, (), (), has_init_image=True)
    assert {"strength=0.45", "sampler='DPM++ 2M'", "scheduler=karras", "prompts.clip_skip=2"} <= set(used.overrides)
    assert used.not_honoured == []
    unused = infotext.overrides(info, (), (), has_init_image=False)
    assert not any(o.startswith("strength=") for o in unused.overrides)
    assert unused.not_honoured[0].startswith("Denoising strength: 0.45: an img2img setting")


@pytest.mark.slow
def test_clip_skip_is_a1111s_and_round_trips_through_the_png(smoke_run, tmp_path, tiny_model_dir):
    """prompts.clip_skip=2: the text encoder's penultimate layer through its final layer norm (A1111's
    encode_with_transformers), checked against transformers' hidden states normalised in NumPy; written as
    A1111's 'Clip skip: 2', and from_png remakes the run from it."""
    import jax.numpy as jnp
    from transformers import CLIPTokenizer, FlaxCLIPTextModel

    from sdjax_runner.engine.encode import _hidden_states

    encoder = FlaxCLIPTextModel.from_pretrained(str(tiny_model_dir / "text_encoder"))
    tokenizer = CLIPTokenizer.from_pretrained(str(tiny_model_dir / "tokenizer"))
    ids = tokenizer(["a red car, a blue sky"], padding="max_length", max_length=77, return_tensors="np").input_ids
    hidden = np.asarray(encoder(ids, output_hidden_states=True).hidden_states[-2], np.float64)
    norm = encoder.params["text_model"]["final_layer_norm"]
    mean, var = hidden.mean(-1, keepdims=True), hidden.var(-1, keepdims=True)
    expected = (hidden - mean) / np.sqrt(var + encoder.config.layer_norm_eps) * np.asarray(norm["scale"]) \
        + np.asarray(norm["bias"])

    from sdjax_runner.models.loading import read_config
    from sdjax_runner.models.nn.clip import CLIPTextModel

    class Pipeline:  # the runner's encoder, on transformers' weights
        text_encoder = CLIPTextModel.from_config(read_config(tiny_model_dir / "text_encoder"))

    got = _hidden_states(Pipeline, {"text_encoder": encoder.params}, jnp.asarray(ids), 2)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)

    run = run_cli("+experiment=smoke", "tracking=none", "prompts.clip_skip=2", f"hydra.run.dir={tmp_path / 'skip'}",
                  cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    skipped = images_of(tmp_path / "skip")
    assert not np.array_equal(skipped[0], images_of(smoke_run[1])[0])
    png = sorted((tmp_path / "skip" / "images").glob("*.png"))[0]
    with Image.open(png) as image:
        assert "Clip skip: 2" in image.text["parameters"]
    again = run_cli(str(png), "+experiment=smoke", "tracking=none", f"hydra.run.dir={tmp_path / 'again'}",
                    cwd=tmp_path, command="from_png")
    assert again.returncode == 0, again.stderr
    assert "from_png: Clip skip: 2 -> prompts.clip_skip=2" in again.stderr
    assert all(np.array_equal(a, b) for a, b in zip(images_of(tmp_path / "again"), skipped, strict=True))


@pytest.mark.slow
def test_clip_skip_past_the_text_encoders_layers_is_one_line(tmp_path):
    result = run_cli("+experiment=smoke", "tracking=none", "prompts.clip_skip=3", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    assert "error: prompts.clip_skip: 3, but tiny-random's text encoder has 2 layers (allowed: 1..2)" in result.stderr


@pytest.mark.parametrize("layers", ["\u00b2", "1,\u00b2", "\u0663", "7,\uff18"])  # ², ٣ (Arabic-Indic), full-width 8
def test_infotext_block_numbers_are_ascii_digits_or_one_line(tmp_path, layers):
    """Round five: ``Skip layer guidance: ²`` passed str.isdigit and ended in a traceback from int(); a superscript,
    an Arabic-Indic or a full-width digit is refused in one line naming the key."""
    from helpers.cli import call_cli

    info = PngInfo()
    info.add_itxt("parameters", f"a cat\nSteps: 2, Sampler: Euler, CFG scale: 5, Seed: 1, Size: 32x32, "
                  f"Model: tiny-random-sd3, Skip layer guidance: \"{layers}\"")
    Image.new("RGB", (8, 8)).save(tmp_path / "slg.png", pnginfo=info)
    assert_one_line_error(call_cli(str(tmp_path / "slg.png"), cwd=tmp_path, command="from_png"),
                          f"error: Skip layer guidance: {layers} (allowed: block numbers separated by commas")


def test_skip_layer_guidance_written_before_it_became_a_guider_is_read_as_the_guider():
    """A PNG an earlier version wrote (``Skip layer guidance: "7,8,9", SLG scale, SLG start, SLG stop``) remakes its
    image with ``guider=skip_layer`` and the same blocks, weight and window."""
    from sdjax_runner.config import infotext

    text = ("a cat\nSteps: 40, Sampler: Euler, CFG scale: 4.5, Seed: 1, Size: 1024x1024, Model: sd3.5-medium, "
            'Skip layer guidance: "7,8,9", SLG scale: 2.8, SLG start: 0.01, SLG stop: 0.2')
    translation = infotext.overrides(infotext.parse(text), ("sd3.5-medium",), ("bf16",), False)
    assert {"guider=skip_layer", "guider.layers=[7,8,9]", "guider.scale=2.8", "guider.skip_start=0.01",
            "guider.skip_stop=0.2"} <= set(translation.overrides)
    assert "Skip layer guidance: 7,8,9 -> guider=skip_layer" in translation.honoured
    cfg = compose_cfg([o for o in translation.overrides if not o.startswith("prompts.")])
    assert (cfg.guider.name, list(cfg.guider.layers), cfg.guider.scale) == ("skip_layer", ["7", "8", "9"], 2.8)


def test_a_controlnet_line_becomes_its_mode_folder_weight_and_control_mode_given_the_control_image():
    """Ours: ``ControlNet: PATH, Control weight: S, Control mode: M`` (record/rundir.py writes the path quoted where a
    comma or colon would end it) -> mode=controlnet and the three keys, with ``controlnet.image`` given; without it,
    said and what to give."""
    from sdjax_runner.record.rundir import quoted

    folder = "/models/a, b: union"
    text = (f"a red cube\nSteps: 4, Sampler: Euler, Seed: 0, Size: 32x32, Model: tiny-random-flux, ControlNet: "
            f"{quoted(folder)}, Control weight: 0.7, Control mode: 2, Guidance Start: 0.1, Guidance End: 0.8")
    given = infotext.overrides(infotext.parse(text), ("tiny-random-flux",), ("fp32",), False, True)
    assert {"mode=controlnet", f"controlnet.model={literal(folder)}", "controlnet.conditioning_scale=0.7",
            "controlnet.control_mode=2", "controlnet.guidance_start=0.1",
            "controlnet.guidance_end=0.8"} <= set(given.overrides)
    # given the init image and mask instead: an inpainting ControlNet's run (mode=controlnet_inpaint)
    inpainting = infotext.overrides(infotext.parse(text), ("tiny-random-flux",), ("fp32",), True, False, True)
    assert "mode=controlnet_inpaint" in inpainting.overrides and "mode=controlnet" not in inpainting.overrides
    missing = infotext.overrides(infotext.parse(text), ("tiny-random-flux",), ("fp32",), False, False)
    assert not any(o.startswith(("mode=", "controlnet.")) for o in missing.overrides)
    assert f"ControlNet: {folder}: a ControlNet run's control image is not in the PNG; give controlnet.image=PATH to " \
           "remake it (an inpainting ControlNet's: init_image=PATH mask_image=PATH)" in missing.not_honoured
