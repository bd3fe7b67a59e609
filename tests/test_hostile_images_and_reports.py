"""Hostile images and hostile sweep records (issue #42, items 5 and 6), as a user meets them: an input image
that is tiny on disk but huge once fitted or decoded, report thumbnails and grids that are decompression
bombs or carry text chunks past Pillow's limits, prompts that matplotlib would read as mathtext and HTML
would read as markup, and status.json fields of the wrong type. The sweep is run once through the CLI;
its copies are damaged as an attacker would, and the pages are opened in headless Chromium."""

from __future__ import annotations

import io
import json
import shutil
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.browser import open_page
from helpers.cli import assert_one_line_error, call_cli, run_cli

# Swept as negative prompts: invalid mathtext (a figure that parses it fails to draw), an HTML comment and
# script tags (the page's embedded JSON must not end or change how the rest of the page is read).
DOLLARS = r"$x^^2$ <!--<script>"
SCRIPT = r"</script> $\frac$ & <b>"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def header_only_png(width: int, height: int, color_type: int = 2) -> bytes:
    """A PNG of a few dozen bytes whose header says ``width`` x ``height`` (no pixel data to speak of)."""
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(b""))
            + png_chunk(b"IEND", b""))


def text_bomb_png() -> bytes:
    """A valid 8 x 8 PNG (200 kB) with a compressed text chunk that inflates to 200 MB."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, "PNG")
    plain = buffer.getvalue()
    text = png_chunk(b"zTXt", b"parameters\x00\x00" + zlib.compress(b"a" * (200 << 20), 9))
    return plain[:33] + text + plain[33:]  # after the signature and IHDR


# --- item 5: input images ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thin(tmp_path_factory) -> dict[str, Path]:
    """1 x 200000 pixels (under 1 kB): the crop fit would scale it to 64 x 12,800,000 (4.6 GB); red, with a
    green band at its centre."""
    folder = tmp_path_factory.mktemp("thin")
    column = np.zeros((200_000, 1, 3), np.uint8)
    column[:] = (255, 0, 0)
    column[99_990:100_010] = (0, 255, 0)
    Image.fromarray(column).save(folder / "init.png")
    Image.fromarray(np.full((200_000, 1), 255, np.uint8)).save(folder / "mask.png")
    (folder / "bomb.png").write_bytes(header_only_png(30_000, 30_000))
    (folder / "tall.png").write_bytes(header_only_png(1, 70_000_000, color_type=0))
    return {p.stem: p for p in folder.iterdir()}


def two_steps(path: Path, size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """A1111's crop fit done as it describes it: scaled (Lanczos) to ``size``, ``box`` cut out; as the
    VAE's input, (3, H, W) in [-1, 1]."""
    with Image.open(path) as picture:
        scaled = picture.convert("RGB").resize(size, Image.Resampling.LANCZOS)
    return np.asarray(scaled.crop(box), np.float32).transpose(2, 0, 1) / 255.0 * 2.0 - 1.0


def test_a_long_thin_image_is_cropped_to_the_run_without_a_gigapixel_detour(thin, tmp_path, monkeypatch):
    from sdjax_runner.config.input_images import MAX_SCALED, read_mode_inputs

    def crop_fit(path: Path) -> np.ndarray:
        return read_mode_inputs("img2img", str(path), None, None, prompts=1).arrays(1, 64, 64, "crop")["init"][0]

    rng = np.random.default_rng(0)
    ordinary, column = tmp_path / "ordinary.png", tmp_path / "column.png"
    Image.fromarray((rng.random((48, 80, 3)) * 255).astype(np.uint8)).save(ordinary)
    Image.fromarray((rng.random((2000, 1, 3)) * 255).astype(np.uint8)).save(column)
    expected = {ordinary: two_steps(ordinary, (107, 64), (21, 0, 85, 64)),  # computed before resizing is bounded
                column: two_steps(column, (64, 128_000), (0, 63_968, 64, 64_032))}  # an 8 MP detour

    resized = []
    resize = Image.Image.resize

    def bounded_resize(self, size, *args, **kwargs):
        resized.append(size)
        assert size[0] * size[1] <= MAX_SCALED * 64 * 64, f"resized to {size}"  # refused before allocating
        return resize(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", bounded_resize)
    # An ordinary picture takes A1111's two steps; a thin one gets their pixels without the detour.
    assert np.array_equal(crop_fit(ordinary), expected[ordinary]) and resized == [(107, 64)]
    assert np.array_equal(crop_fit(column), expected[column]) and resized[1:] == [(64, 64)]
    inputs = read_mode_inputs("inpaint", str(thin["init"]), str(thin["mask"]), None, prompts=1)
    start = time.perf_counter()
    arrays = inputs.arrays(1, 64, 64, "crop")
    assert time.perf_counter() - start < 2.0  # was 35 s and 4.6 GB per image
    assert arrays["init"].shape == (1, 3, 64, 64) and (arrays["mask"] == 1).all()
    red, green, blue = arrays["init"][0]  # the centre: the green band
    assert (green > 0.9).all() and (red < -0.9).all() and (blue < -0.9).all()


@pytest.mark.slow
def test_an_inpaint_run_from_a_long_thin_image_with_crop_finishes(tmp_path, thin, tiny_model_dir):
    result = run_cli("+experiment=smoke", "tracking=none", "mode=inpaint", f"init_image={thin['init']}",
                     f"mask_image={thin['mask']}", "resize_mode=crop", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    images = sorted((tmp_path / "run" / "images").glob("*.png"))
    assert len(images) == 8 and all(Image.open(p).size == (64, 64) for p in images)


@pytest.mark.parametrize("overrides, expected", [
    (["mode=img2img", "init_image={bomb}"],
     "error: init_image: {bomb} is a decompression bomb (Image size (900000000 pixels) exceeds"),
    (["mode=inpaint", "init_image={init}", "mask_image={tall}"],
     "error: mask_image: {tall} is 1 x 70000000 pixels (70 MP) (allowed: an image of at most 64 MP)"),
    (["mode=controlnet", "controlnet.model=tiny-random-controlnet", "controlnet.image={bomb}"],
     "error: controlnet.image: {bomb} is a decompression bomb"),
])
def test_an_input_image_too_large_to_decode_is_one_line_naming_its_key_and_limit(tmp_path, thin, overrides, expected):
    result = call_cli("+experiment=smoke", "tracking=none", *[o.format(**thin) for o in overrides], cwd=tmp_path)
    assert_one_line_error(result, expected.format(**thin))
    assert result.stderr.rstrip().endswith("(allowed: an image of at most 64 MP)")
    assert [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "mlflow.db"] == []  # nothing written


# --- item 6: reports -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_sweep(tmp_path_factory, tiny_model_dir) -> tuple[Path, str]:
    """(sweep directory, the sweep's output) of 2 steps x 2 hostile negative prompts, run once."""
    work = tmp_path_factory.mktemp("hostile-sweep")
    sweep_dir = work / "sweep"
    quoted = ",".join(f"'{value}'" for value in (DOLLARS, SCRIPT))  # Hydra's quoted values: taken as written
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "sampling.num_inference_steps=1,2",
                     f"prompts.negative={quoted}", f"hydra.sweep.dir={sweep_dir}", cwd=work)
    assert result.returncode == 0, result.stderr
    return sweep_dir, result.stdout + result.stderr


def page_rows(page) -> list[dict]:
    """The rows of the page's embedded JSON, as a script on the page reads them."""
    return page.evaluate("JSON.parse(document.getElementById('points-data').textContent)")


def legend_and_tick_texts(page) -> list[str]:
    return page.locator("figure svg text").all_text_contents()


@pytest.mark.slow
@pytest.mark.browser
def test_prompts_with_dollars_and_script_tags_are_drawn_and_shown_as_text(hostile_sweep):
    sweep_dir, output = hostile_sweep
    assert "was not drawn" not in output and "Traceback" not in output
    for name in ("report.html", "report.png", "contact_sheet.png"):
        assert (sweep_dir / name).is_file(), name
    with Image.open(sweep_dir / "report.png") as picture:
        assert picture.size[0] > 600
    text = (sweep_dir / "report.html").read_text(encoding="utf-8")
    data = text[text.index('id="points-data">'):]
    assert "<!--" not in data[:data.index("</script>")] and "\\u003c!--\\u003cscript\\u003e" in data
    with open_page((sweep_dir / "report.html").as_uri()) as opened:
        page = opened.page
        assert opened.console_errors == []
        assert page.evaluate("document.scripts.length") == 2  # the sorting script and the data: nothing more
        rows = page_rows(page)
        assert sorted(r["prompts.negative"].strip("'") for r in rows) == sorted([DOLLARS, SCRIPT] * 2)
        cells = page.locator("table.points tbody td:nth-child(3)").all_inner_texts()
        assert sorted(c.strip("'") for c in cells) == sorted([DOLLARS, SCRIPT] * 2)
        # The plot of quality against steps: one line per negative prompt, its legend the prompt as meant (the
        # value, without Hydra's quotes).
        legend = legend_and_tick_texts(page)
        assert f"prompts.negative={DOLLARS}" in legend and f"prompts.negative={SCRIPT}" in legend, legend


@pytest.fixture
def forged(hostile_sweep, tmp_path) -> Path:
    """A copy of the sweep as an attacker leaves it: status.json fields of the wrong type, numbers that are
    not numbers, and images that are bombs, text-chunk bombs or not images at all."""
    sweep_dir = tmp_path / "forged"
    shutil.copytree(hostile_sweep[0], sweep_dir)
    for name in ("report.html", "report.png", "contact_sheet.png"):
        (sweep_dir / name).unlink()

    def edit(job: int, name: str, **fields) -> None:
        path = sweep_dir / str(job) / name
        path.write_text(json.dumps(dict(json.loads(path.read_text()), **fields)))

    def image_files(job: int) -> list[Path]:
        records = json.loads((sweep_dir / str(job) / "images.json").read_text())
        return [sweep_dir / str(job) / records[0]["file"], sweep_dir / str(job) / "grid.png"]

    edit(0, "status.json", status=123, error=["<script>alert(1)</script>"], run_id=5)
    edit(1, "status.json", error={"a": 1}, run_id="<img src=x onerror=alert(1)>")
    edit(1, "timings.json", images_per_s=10**400, mfu="<b>", compile_s=[1])
    edit(1, "quality.json", clip_score_mean={"x": 1}, clip_score_std="\ud800")
    first, grid = image_files(1)
    first.write_bytes(header_only_png(30_000, 30_000))  # a decompression bomb
    grid.write_bytes(text_bomb_png())
    image_files(2)[0].write_text("not an image")  # its grid is shown instead
    edit(3, "status.json", error="a lone surrogate \ud800 in a record")  # what UTF-8 cannot write
    return sweep_dir


@pytest.mark.slow
@pytest.mark.browser
def test_the_report_of_a_sweep_with_forged_records_and_bomb_images_is_written(forged, tmp_path):
    start = time.perf_counter()
    result = run_cli(str(forged), cwd=tmp_path, command="report", process=True)  # its standard error, as the shell's
    assert time.perf_counter() - start < 60
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and result.stdout.strip() == str(forged / "report.html")
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("report: 3 image file(s) could not be shown"), warnings
    assert "job 1: images/" in warnings[0] and "is a decompression bomb" in warnings[0]
    assert "job 1: grid.png: cannot be decoded (Decompressed data too large" in warnings[0]
    assert "job 2: images/" in warnings[0] and "is not an image Pillow can read" in warnings[0]
    with open_page((forged / "report.html").as_uri()) as opened:
        page = opened.page
        assert opened.console_errors == []
        assert {url.split(":", 1)[0] for url in opened.requests} == {"file"}
        assert page.evaluate("document.scripts.length") == 2 and page.evaluate("document.images.length") == 2
        cells = {c.get_attribute("data-job"): c for c in page.locator("td.cell").all()}
        assert cells["0"].inner_text().startswith("DAMAGED")
        assert cells["1"].inner_text().startswith("image unreadable")
        assert "decompression bomb" in cells["1"].get_attribute("title")
        assert cells["2"].locator("img").count() == 1 and cells["3"].locator("img").count() == 1
        table = page.locator("table.points tbody tr")
        assert table.nth(0).locator("td").nth(3).inner_text() == "DAMAGED"
        assert table.nth(1).locator("td").nth(3).inner_text() == "FINISHED"
        assert table.nth(1).locator("td").last.inner_text() == ""  # the forged run id: blank, no link
        rows = page_rows(page)
        assert [(r["status"], r["error"], r["run_id"]) for r in rows[:2]] == [("DAMAGED", "", ""), ("FINISHED", "", "")]
        assert (rows[1]["images_per_s"], rows[1]["mfu"], rows[1]["clip_score_mean"]) == ("", "", "")
        assert rows[3]["error"] == "a lone surrogate \\ud800 in a record"
        assert table.nth(3).locator("td").nth(3).inner_text() == "FINISHED (a lone surrogate \\ud800 in a record)"


@pytest.mark.slow
def test_a_resumed_sweep_with_bomb_grids_still_writes_its_contact_sheet_and_reports(forged, tmp_path):
    for job in (0, 1):  # finished, so nothing runs again: the sweep's end reads every job's images
        path = forged / str(job) / "status.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), status="FINISHED")))
    (forged / "2" / "grid.png").write_bytes(header_only_png(30_000, 30_000))
    result = run_cli(str(forged), cwd=tmp_path, command="resume")
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "was not drawn" not in output
    assert "sweep: 2 grid.png file(s) could not be read, grey on the contact sheet: job 1: cannot be decoded" in output
    for name in ("report.html", "report.png", "contact_sheet.png"):
        assert (forged / name).is_file(), name
    with Image.open(forged / "contact_sheet.png") as sheet:
        assert sheet.size == (2 * 256, 2 * (64 * 2 + 16))  # 2 x 2 cells of the 4 x 2 image grids, labelled
        grey = np.asarray(sheet.convert("RGB"))[16 + 40, 256 + 128]  # job 1's cell: steps=1, the second prompt
        assert tuple(grey) == (200, 200, 200)
