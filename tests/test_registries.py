"""One entry per mode and per model family (issue #45): the config's registry, the engine's (and, for a
family, the loader's) agree name for name, everything other modules read about a mode is its entry, and
each family runs end to end from the command line on its tiny model. (The samplers' registry is walked in
test_samplers.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers.cli import run_cli
from sdjax_runner.config import families, modes
from sdjax_runner.config.schema import GenerationMode


def test_each_mode_is_one_entry_that_the_schema_and_the_engine_agree_with():
    from sdjax_runner.config.families import FAMILIES as ENTRIES
    from sdjax_runner.engine.families import FAMILIES
    from sdjax_runner.engine.modes import NUMBERS, PER_IMAGE

    assert tuple(modes.MODES) == tuple(GenerationMode.__members__)
    for name, family in FAMILIES.items():  # each family prepares the modes its entry lists, and only those
        assert set(family.modes) == set(ENTRIES[name].modes) <= set(modes.MODES), name
        assert all(callable(prepare) for prepare in family.modes.values())
    assert set().union(*(ENTRIES[name].modes for name in FAMILIES)) == set(modes.MODES)  # every mode runs somewhere
    for name, entry in modes.MODES.items():
        assert PER_IMAGE[name] == entry.per_image and NUMBERS[name] == entry.numbers
        assert set(entry.numbers) <= {"start", "control_scale", "control_mode", "control_start",
                                       "control_end"}, name  # what engine/generate.py places
        assert ("start" in entry.numbers) == (entry.default_strength is not None), name  # strength -> start step
        assert modes.strength(name, None) == entry.default_strength
    assert modes.IMAGE_KEYS == ("init_image", "mask_image", "reference_images", "controlnet.image")


def _config(mode: str, **values):
    """What config/modes.check reads of the typed config: ``mode`` with the given keys set, the rest unset."""
    from types import SimpleNamespace

    return SimpleNamespace(mode=GenerationMode[mode], init_image=values.get("init_image"),
                           mask_image=values.get("mask_image"), reference_images=values.get("reference_images"),
                           strength=None,
                           sampling=SimpleNamespace(num_inference_steps=20),
                           controlnet=SimpleNamespace(model=values.get("controlnet.model"),
                                                      image=values.get("controlnet.image"), conditioning_scale=1.0))


@pytest.mark.parametrize("mode", [name for name, entry in modes.MODES.items() if entry.needs])
def test_each_key_a_mode_needs_is_refused_in_one_line_when_missing(mode):
    from sdjax_runner.errors import UserError

    entry = modes.MODES[mode]
    for missing in entry.needs:
        given = {key: "given" for key in entry.needs if key != missing}
        with pytest.raises(UserError) as caught:
            modes.check(_config(mode, **given), "euler")
        assert caught.value.key == missing
        assert f"a value is required with mode={mode}" in str(caught.value)


@pytest.mark.parametrize("mode", list(modes.MODES))
def test_a_modes_images_are_read_under_its_entrys_names(mode, tmp_path):
    """config/input_images reads exactly the images the entry lists, and they become the per-image inputs
    the engine places (their names)."""
    from sdjax_runner.config.input_images import read_mode_inputs

    path = tmp_path / "in.png"
    Image.fromarray(np.full((16, 16, 3), 200, np.uint8)).save(path)
    inputs = read_mode_inputs(mode, str(path), str(path), str(path), prompts=1, references=[str(path)] * 2)
    arrays = inputs.arrays(1, 16, 16, "stretch")
    assert sorted(arrays) == sorted(modes.MODES[mode].per_image)  # (the optional references too, given here)
    if "references" in arrays:  # every prompt's row holds every reference image
        assert arrays["references"].shape == (1, 2, 3, 16, 16)


def test_each_family_is_one_entry_in_config_models_and_engine():
    from sdjax_runner.engine.families import FAMILIES as ENGINE
    from sdjax_runner.models.loaders import LOADERS

    assert tuple(families.FAMILIES) == tuple(LOADERS) == tuple(ENGINE)
    for name, entry in families.FAMILIES.items():
        for pipeline in entry.pipelines:
            assert families.family_of(pipeline, "x") is entry
            assert families.family_of(f"Flax{pipeline}", "x") is entry
        assert set(entry.modes) <= set(modes.MODES), name
        assert ENGINE[name].name == name and set(ENGINE[name].modes) >= set(entry.modes), name


def test_no_code_outside_the_family_registries_branches_on_a_familys_name():
    """What differs between families is a field of their entries (config/families.py, models/loaders.py,
    engine/families.py), so a new family is its entries and its package: no ``family == "flux"`` elsewhere. Read
    from the source: any comparison of a family's name with something named for a family, or a name membership
    test, outside the three registries."""
    import ast
    from pathlib import Path

    package = Path(families.__file__).resolve().parents[1]
    registries = {package / "config" / "families.py", package / "models" / "loaders.py",
                  package / "engine" / "families.py",
                  # (not a branch of ours: which family another tool's infotext comes from, by Forge's own marks --
                  # "Distilled CFG Scale" is FLUX.1's, "Shift" SD 3's -- or a model name of a family)
                  package / "config" / "infotext.py"}
    names = set(families.FAMILIES)

    def mentions_family(node: ast.AST) -> bool:
        return any("family" in (getattr(n, "attr", None) or getattr(n, "id", None) or "").lower()
                   for n in ast.walk(node))

    def family_names(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Constant) and n.value in names for n in ast.walk(node))

    found = []
    for path in sorted(package.rglob("*.py")):
        if path in registries:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(mentions_family, sides)) and any(map(family_names, sides)):
                    found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert len(list(package.rglob("*.py"))) > 100
    assert not found, f"branches on a family's name outside the registries: {found}"


def test_a_pipeline_no_family_runs_is_one_line_naming_the_pipelines_that_run():
    from sdjax_runner.errors import UserError

    with pytest.raises(UserError) as caught:
        families.family_of("FluxPipelineOfTheFuture", "/models/x")
    message = str(caught.value)
    assert caught.value.key == "model.pretrained_model_name_or_path"
    assert "FluxPipelineOfTheFuture, which this runner does not run" in message
    assert all(pipeline in message for pipeline in families.PIPELINES)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(families.FAMILIES))
def test_each_family_runs_from_the_command_line_on_its_tiny_model(family, tmp_path, cache_dir):
    entry = families.FAMILIES[family]
    result = run_cli(f"model={entry.tiny}", "dtype=fp32", "sampling.num_inference_steps=2", "sampling.height=64",
                     "sampling.width=64", "parallelism.num_devices=2", "prompts.texts=[a red cube]",
                     "tracking=none", "metrics.clip_score.enabled=false", f"paths.output_root={tmp_path}",
                     f"paths.cache_dir={cache_dir}", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    assert len(records) == 2 and all(r["model"] == entry.tiny for r in records)
    for record in records:
        with Image.open(tmp_path / "run" / record["file"]) as image:
            assert image.size == (64, 64) and np.asarray(image).std() > 0  # a picture, not a flat field


def test_each_quality_metric_is_one_entry_that_every_reader_takes_its_fields_from():
    """#61 item 5: metrics/registry.py. Each entry's fields are declared by the records (ImageRecord per image,
    Quality per run); the sweep summary's columns, the report's table and plots, the judged comparison, `runs
    list`, the tracker run's headline and `evaluate`'s pairs are the registry's; and no module but the registry,
    the records and the metrics' own modules spells a metric's field name (read from the source)."""
    import ast
    import dataclasses
    from pathlib import Path

    from sdjax_runner.commands import evaluate, runs
    from sdjax_runner.metrics import comparison, report
    from sdjax_runner.metrics.registry import METRICS, per_image, run_fields
    from sdjax_runner.record import catalog, report_page, sweep, tracking
    from sdjax_runner.records import ImageRecord, Quality

    image_fields = {f.name for f in dataclasses.fields(ImageRecord)}
    quality_fields = {f.name for f in dataclasses.fields(Quality)}
    for metric in METRICS.values():
        assert metric.name in image_fields and {metric.run_field, *metric.more_run_fields} <= quality_fields
        assert (Path(comparison.__file__).parents[1] / metric.module).is_file()
    assert sweep.SUMMARY_QUALITY[:-1] == run_fields()
    assert [n[0] for n in report_page.NUMBERS[2:-1]] == [m.run_field for m in METRICS.values()]
    assert list(report.QUALITY) == [m.run_field for m in METRICS.values()]
    assert list(report.SETTING_METRICS) == list(comparison.PER_IMAGE_METRICS) == list(per_image())
    assert per_image() == evaluate.PER_IMAGE_METRICS
    assert catalog.HEADLINE[4:] == tuple(m.run_field for m in METRICS.values())
    assert [h[0] for h in tracking.HEADLINE[3:]] == [m.run_field for m in METRICS.values()]
    assert [c for c, _ in runs.LIST_COLUMNS if c in run_fields()] == [m.run_field for m in METRICS.values() if m.column]

    package = Path(comparison.__file__).resolve().parents[1]
    owners = {package / "metrics" / "registry.py", package / "records.py",
              *(package / m.module for m in METRICS.values()), package / "metrics" / "evaluate.py"}
    names = {field for m in METRICS.values() for field in (m.name, m.run_field, *m.more_run_fields)}

    def field_reads(tree: ast.AST):
        """Constants used as a record's key: row["psnr"], row.get("psnr"), getattr(r, "psnr"), {"psnr": ...},
        and the texts of a tuple of keys (("clip_score_mean", "psnr"))."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript):
                yield node.slice
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "get", "getattr", "pop", "setdefault", "hasattr"):
                yield from node.args[:2]
            elif isinstance(node, ast.Dict):
                yield from (k for k in node.keys if k is not None)
            elif isinstance(node, ast.Tuple):
                yield from node.elts

    found = [f"{path.relative_to(package)}:{node.lineno} {node.value}"
             for path in sorted(package.rglob("*.py")) if path not in owners
             for node in field_reads(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and node.value in names]
    assert not found, f"a metric's field named outside its entry: {found}"
