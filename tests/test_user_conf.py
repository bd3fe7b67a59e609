"""A conf/ of your own (the working directory's, found with no flag), the example experiments the repository ships
in its conf/experiment/, and the command line's help and unknown commands -- all as a user meets them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, call_cli, run_cli

ROOT = Path(__file__).resolve().parent.parent


def finished_jobs(sweep: Path) -> list[dict]:
    record = json.loads((sweep / "sweep.json").read_text())
    statuses = [json.loads((sweep / str(n) / "status.json").read_text()) for n in range(len(list(sweep.glob("[0-9]*"))))]
    assert all(s["status"] == "FINISHED" for s in statuses), statuses
    return [dict(record=record, status=s, dir=sweep / str(n)) for n, s in enumerate(statuses)]


@pytest.mark.slow
def test_an_experiment_in_your_own_conf_is_found_with_no_flag_and_one_shadowing_a_packaged_one_is_said(tmp_path):
    experiments = tmp_path / "conf" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - smoke\nrun_name: mine\n"
                                           "sampling:\n  num_inference_steps: 2\n")
    packaged = (ROOT / "sdjax_runner" / "conf" / "experiment" / "smoke.yaml").read_text()
    (experiments / "smoke.yaml").write_text(packaged.replace("num_inference_steps: 4", "num_inference_steps: 3"))
    mine = run_cli("+experiment=mine", "tracking=none", "parallelism.num_batches=1", "timing.repeats=1",
                   f"hydra.run.dir={tmp_path / 'mine'}", cwd=tmp_path)
    assert mine.returncode == 0, mine.stderr
    images = json.loads((tmp_path / "mine" / "images.json").read_text())
    assert {r["steps"] for r in images} == {2} and len(images) == 8
    # A sweep over the shadowing experiment: yours runs (3 steps), and the log says so once for the command.
    sweep = run_cli("-m", "+experiment=smoke", "tracking=none", "seed=1,2", "timing.repeats=1",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr
    said = [line for line in (sweep.stdout + sweep.stderr).splitlines() if "(yours) is used" in line]
    assert len(said) == 1 and "conf/experiment/smoke.yaml (yours) is used in place of the packaged experiment/smoke" \
        in said[0]
    for job in finished_jobs(tmp_path / "sweep"):
        assert {r["steps"] for r in json.loads((job["dir"] / "images.json").read_text())} == {3}
    # --help lists your experiments beside the packaged ones.
    shown = run_cli("--help", cwd=tmp_path)
    experiment_line = next(line for line in shown.stdout.splitlines() if line.startswith("experiment:"))
    assert "mine" in experiment_line and "guide_same_prompt" in experiment_line


@pytest.mark.parametrize("name, points, swept", [
    ("sampler_steps", 4, ["sampler", "sampling.num_inference_steps"]),
    ("img2img_strength", 3, ["strength"]),
    ("lora_scale", 3, ["lora.0.scale"]),
])
@pytest.mark.slow
def test_the_example_experiments_the_repository_ships_run_as_their_comments_say(tmp_path, name, points, swept):
    """Run as its comment says, from a copy of the repository's conf/ and examples/ (python
    examples/make_example_files.py first where it says so, then python -m sdjax_runner -m +experiment=NAME):
    every point finishes, the sweep sweeps what the file's hydra.sweeper.params name, report.html is written."""
    import shutil
    import subprocess
    import sys

    for folder in ("conf", "examples"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    if "make_example_files.py" in (ROOT / "conf" / "experiment" / f"{name}.yaml").read_text():
        made = subprocess.run([sys.executable, str(ROOT / "examples" / "make_example_files.py"),
                               str(tmp_path / "examples")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert made.returncode == 0 and "Traceback" not in made.stderr, made.stderr
    sweep = tmp_path / "sweep"
    result = run_cli("-m", f"+experiment={name}", "tracking=none", "timing.repeats=1", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = finished_jobs(sweep)
    assert len(jobs) == points and jobs[0]["record"]["swept_keys"] == swept
    assert (sweep / "report.html").is_file()
    if name == "sampler_steps":  # each sampler's 4-step point is compared with its 8-step point
        rows = json.loads((sweep / "summary.json").read_text())
        four = [row["psnr"] for row in rows if row["sampling.num_inference_steps"] == "4"]
        assert len(four) == 2 and all(isinstance(value, float) and 5 < value < 100 for value in four), rows
    if name == "lora_scale":  # the further from scale 0 (the reference), the further the images move
        psnr = {row["lora.0.scale"]: row["psnr"] for row in json.loads((sweep / "summary.json").read_text())}
        assert psnr["0.5"] > psnr["1"] > 5, psnr
    if name == "img2img_strength":
        inputs = json.loads((jobs[0]["dir"] / "inputs.json").read_text())
        assert "examples/init.png" in json.dumps(inputs)


def test_help_points_at_the_docs_and_an_unknown_command_is_one_line(tmp_path):
    shown = run_cli("--help", cwd=tmp_path)
    assert shown.returncode == 0 and "docs/reference/config.md" in shown.stdout
    assert "your own ./conf/experiment/" in shown.stdout
    from sdjax_runner.commands import COMMANDS

    for command in COMMANDS:
        help_text = run_cli("--help", cwd=tmp_path, command=command)
        assert help_text.returncode == 0, help_text.stderr
        assert f"Docs: docs/reference/commands.md#{command}" in help_text.stdout
        assert len(help_text.stdout.splitlines()) < 60  # a short usage; the page has the rest
    assert_one_line_error(run_cli("run", "+experiment=smoke", cwd=tmp_path),
                          "error: unknown command 'run' (allowed: runs, rerun, sync, resume, from_png, report, "
                          "evaluate; a run is python -m sdjax_runner +experiment=NAME")


def test_a_python_without_the_projects_libraries_gets_one_line_saying_to_activate_the_venv(tmp_path):
    """The README's examples say python: a Python without the project's libraries (here the test's own with its
    site-packages switched off, -S, as a system Python is) says what to do in one line, no traceback."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-S", "-m", "sdjax_runner", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "cannot run sdjax-runner (no hydra, omegaconf, jax" in result.stderr
    assert "source .venv/bin/activate" in result.stderr


def test_an_experiment_of_yours_that_sets_hydra_mode_makes_a_plain_command_a_sweep(tmp_path):
    """A config may set ``hydra.mode`` (Hydra's way to make a command without ``-m`` a sweep): with a conf/ of yours on
    the search path Hydra composes to read it (internals.compose_once answers without composing only where the
    packaged configs alone are there). Told by the refusal: a sweep's check of its points names the bad seed, where
    a run is refused by Hydra's "ambiguous value" for a swept key."""
    experiments = tmp_path / "conf" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "sweeping.yaml").write_text("# @package _global_\ndefaults:\n  - smoke\nhydra:\n  mode: MULTIRUN\n")
    swept = call_cli("+experiment=sweeping", "tracking=none", "seed=0,-1", f"hydra.sweep.dir={tmp_path / 's'}",
                     cwd=tmp_path)
    assert swept.returncode == 2 and swept.stderr.strip().startswith("error: seed: "), swept.stderr
    plain = call_cli("+experiment=smoke", "tracking=none", "seed=0,-1", cwd=tmp_path)  # the packaged: a run
    assert plain.returncode == 2 and "error: seed: " not in plain.stderr and "seed=0,-1" in plain.stderr, plain.stderr


def test_a_command_composes_its_config_once_where_only_the_packaged_configs_are_there(tmp_path, monkeypatch):
    """Hydra's get_mode composes the whole config only to read hydra.mode, then the run composes it again: with the
    packaged configs alone (no conf/ here) the mode is known without it (internals.compose_once), and a command
    that stops at bad input costs one composition."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    composed = []
    load = ConfigLoaderImpl.load_configuration

    def counted(self, *args, **kwargs):
        composed.append(kwargs.get("run_mode"))
        return load(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    result = call_cli("+experiment=smoke", "tracking=none", "sampling.num_inference_steps=0", cwd=tmp_path)
    assert result.returncode == 2 and "sampling.num_inference_steps" in result.stderr
    assert len(composed) == 1, composed
