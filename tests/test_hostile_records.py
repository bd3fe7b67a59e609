"""Data is never configuration, and every record reader is bounded: what a hostile PNG, a crafted sweep folder
or a damaged run record does to from_png, resume, rerun, report and runs -- one line, a non-zero exit, no
traceback, nothing outside the run changed, no value of this machine's environment written anywhere."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.mlflow_store import nothing_written

SECRET = "s3cr3t-from-the-environment"
ENV = {"SDJAX_TEST_SECRET": SECRET}
LOOKUP = "${oc.env:SDJAX_TEST_SECRET}"
# A YAML alias bomb: 9 levels of 9 aliases, ~400 bytes that expand to 9^9 strings.
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def png_with(path: Path, parameters: str, size: tuple[int, int] = (8, 8)) -> Path:
    info = PngInfo()
    info.add_itxt("parameters", parameters)
    Image.new("RGB", size).save(path, pnginfo=info)
    return path


def files_holding(root: Path, text: str) -> list[Path]:
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time: what 'nothing changed' compares."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------------------ from_png
@pytest.mark.slow
def test_a_png_prompt_reaches_the_run_as_text_never_as_an_interpolation(tmp_path):
    """The prompt of a crafted PNG holds OmegaConf interpolations (escaped and not, after a backslash, as the
    quoting of earlier versions let through): the run makes images of that very text; the environment's value
    is nowhere -- not in the PNGs, images.json, inputs.json, .hydra/, the log, nor the MLflow store."""
    prompt = f"a \\{LOOKUP} and {LOOKUP} and \\\\{LOOKUP}, it's 'quoted', ends in \\"
    negative = f"\\{LOOKUP}"
    png = png_with(tmp_path / "crafted.png", f"{prompt}\nNegative prompt: {negative}\nSteps: 2, Sampler: Euler, "
                   "CFG scale: 7, Seed: 3, Size: 64x64, Model: tiny-random")
    result = run_cli(str(png), "+experiment=smoke", "parallelism.num_batches=1", "timing.repeats=1",
                     "metrics.clip_score.enabled=false", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=ENV,
                     command="from_png")
    assert result.returncode == 0, result.stderr
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    assert {r["prompt"] for r in records} == {prompt} and {r["negative_prompt"] for r in records} == {negative}
    assert files_holding(tmp_path, SECRET) == [] and SECRET not in result.stdout + result.stderr


@pytest.mark.slow
def test_a_prompt_given_as_literal_text_stays_text_and_a_broken_interpolation_is_one_line(tmp_path):
    """On the command line, ``${...}`` is OmegaConf's: one that names no key is one line naming the prompt (not
    two naming hydra.run.dir, whose name reads the overrides), before any folder is made. Escaped, it is the
    prompt's text, and stays text: the plan's parameter list once resolved the resolved config again, which
    turned the text back into a lookup (the environment's value into MLflow's params)."""
    from sdjax_runner.config.overrides import literal

    refused = run_cli("+experiment=smoke", "prompts.texts=[a ${nope} b]", cwd=tmp_path)
    assert_one_line_error(refused, "error: prompts.texts[0]: Interpolation key 'nope' not found (allowed: a value "
                                   "that resolves; for a literal '${', write '\\${')")
    assert "hydra.run.dir" not in refused.stdout + refused.stderr and nothing_written(tmp_path)
    result = run_cli("+experiment=smoke", f"prompts.texts=[{literal('a ' + LOOKUP)}]",
                     f"prompts.negative={literal(LOOKUP)}", "parallelism.num_batches=1", "timing.repeats=1",
                     "metrics.clip_score.enabled=false", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=ENV)
    assert result.returncode == 0, result.stderr
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    assert {(r["prompt"], r["negative_prompt"]) for r in records} == {("a " + LOOKUP, LOOKUP)}
    assert files_holding(tmp_path, SECRET) == [] and SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("settings,expected", [
    ("Steps: ², Seed: 1, CFG scale: 7", "error: Steps: '²' is not a number the runner reads (allowed: a whole number"),
    ("Steps: 2, Seed: ١٢, CFG scale: 7", "error: Seed: '١٢' is not a number the runner reads"),
    (f"Steps: 2, Seed: 1, CFG scale: {LOOKUP}", "error: CFG scale: '${oc.env:SDJAX_TEST_SECRET}' is not a number"),
    ("Steps: 2, Seed: 1, CFG scale: nan", "error: CFG scale: 'nan' is not a number the runner reads"),
    (f"Steps: 2, Seed: 1, Denoising strength: {LOOKUP}", "error: Denoising strength: '${oc.env:SDJAX_TEST_SECRET}'"),
    ("Steps: 2, Seed: 1, Size: ²x64", "error: Size: '²x64' is not a size the runner reads"),
    (f"Steps: 2, Seed: 1, Sampler: {LOOKUP}", "error: Sampler: unknown sampler '${oc.env:SDJAX_TEST_SECRET}'"),
    (f"Steps: 2, Seed: 1, Sampler: \\{LOOKUP}", "error: Sampler: unknown sampler '\\\\${oc.env:SDJAX_TEST_SECRET}'"),
], ids=["superscript steps", "arabic-indic seed", "cfg lookup", "cfg nan", "strength lookup", "size", "sampler lookup",
        "sampler escaped lookup"])
def test_a_malformed_setting_in_a_png_is_one_line_before_anything_runs(tmp_path, settings, expected):
    png = png_with(tmp_path / "crafted.png", f"a cat\n{settings}")
    cli = run_cli if settings.startswith("Steps: \u00b2") else call_cli  # one in a process of its own
    result = cli(str(png), "mode=img2img", f"init_image={png}", cwd=tmp_path, env=ENV, command="from_png")
    assert_one_line_error(result, expected)
    assert SECRET not in result.stdout + result.stderr
    assert nothing_written(tmp_path)


def test_an_empty_infotext_and_a_bomb_png_are_one_line(tmp_path):
    assert_one_line_error(run_cli("--infotext", "", cwd=tmp_path, command="from_png"),
                          "error: --infotext: is empty (allowed: an A1111 infotext")
    bomb = tmp_path / "bomb.png"
    png_with(bomb, "a cat\nSteps: 2, Seed: 1, CFG scale: 7")
    data = bytearray(bomb.read_bytes())  # the IHDR's width and height say 30000 x 30000
    data[16:24] = (30000).to_bytes(4, "big") * 2
    import zlib

    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    bomb.write_bytes(bytes(data))
    started = time.monotonic()
    assert_one_line_error(run_cli(str(bomb), cwd=tmp_path, command="from_png"),
                          f"error: IMAGE: {bomb} is a decompression bomb")
    assert time.monotonic() - started < 60 and nothing_written(tmp_path)


# -------------------------------------------------------------------------------------------------- resume
def crafted_sweep(root: Path, task: list[str], hydra: list[str], runtime: dict | None = None,
                  text: str | None = None) -> Path:
    sweep = root / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"overrides": task, "swept_keys": ["seed"]}))
    record = {"hydra": {"overrides": {"task": task, "hydra": hydra}, "runtime": runtime or {"cwd": str(root)},
                        "job": {"config_name": "config"}}}
    (sweep / "multirun.yaml").write_text(text if text is not None else yaml.safe_dump(record))
    return sweep


RESUME_CASES = {
    "a callback that truncates a file": ([], ["+hydra.callbacks.x._target_=builtins.open",
                                              "+hydra.callbacks.x.file={victim}", "+hydra.callbacks.x.mode=w"],
                                         "a _target_ (an object Hydra would build: code from data)"),
    "a _target_ among the task overrides": (["+foo._target_=os.makedirs", "+foo.name={victim}.d"], [],
                                            "a _target_ (an object Hydra would build: code from data)"),
    "a callbacks group": ([], ["hydra/callbacks=evil"], "a Hydra callback (code from data)"),
    "a Hydra key the runner never records": ([], ["hydra.job.env_set.LD_PRELOAD=/tmp/x.so"],
                                             "a Hydra setting this runner does not record"),
    "an environment lookup": ([f"prompts.negative={LOOKUP}", "seed=0,1"], [],
                              "a resolver call (${...:...}) that would read this machine's state"),
    "a nested lookup": (["prompts.negative=${oc.decode:${oc.env:SDJAX_TEST_SECRET}}"], [],
                        "a resolver call (${...:...}) that would read this machine's state"),
    "an unknown top-level key": (["+evil.key=1"], [], "a key the config does not have"),
}


@pytest.mark.parametrize("case", RESUME_CASES)
def test_resume_replays_only_what_the_runner_records(tmp_path, case):
    task, hydra, why = RESUME_CASES[case]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    sweep = crafted_sweep(tmp_path, [o.replace("{victim}", str(victim)) for o in task],
                          [o.replace("{victim}", str(victim)) for o in hydra])
    before = tree(tmp_path)
    cli = run_cli if case == "a callback that truncates a file" else call_cli  # one in a process of its own
    result = cli("resume", str(sweep), cwd=tmp_path, env=ENV)
    assert_one_line_error(result, f"error: {sweep / 'multirun.yaml'}: {why}; it is not replayed: ")
    assert "allowed: overrides of config keys, hydra/launcher, hydra/sweeper" in result.stderr
    assert tree(tmp_path) == before and victim.read_text() == "precious" and SECRET not in result.stderr


def test_resume_refuses_configs_the_sweep_folder_brings_and_unbounded_yaml(tmp_path):
    configs = tmp_path / "sweep" / "configs"
    sweep = crafted_sweep(tmp_path, ["seed=0,1"], [], runtime={
        "cwd": str(tmp_path), "config_sources": [{"path": str(configs), "provider": "command-line", "schema": "file"}]})
    configs.mkdir()
    assert_one_line_error(call_cli("resume", str(sweep), cwd=tmp_path),
                          f"error: --config-dir: {configs} is inside the sweep directory {sweep}")
    for text, why in ((ALIAS_BOMB, "uses a YAML alias (*a); records are written without them"),
                      ("hydra: !!python/object/apply:os.system [echo RAN]\n", "cannot be read as YAML"),
                      ("[" * 100 + "]" * 100, "is nested deeper than 64 levels"),
                      ("[" * 100_000, "is not valid YAML")):
        shutil.rmtree(tmp_path / "sweep")
        sweep = crafted_sweep(tmp_path, [], [], text=text)
        started = time.monotonic()
        result = call_cli("resume", str(sweep), cwd=tmp_path)
        assert_one_line_error(result, f"error: SWEEP_DIR: {sweep / 'multirun.yaml'} {why}")
        assert time.monotonic() - started < 60 and "RAN" not in result.stdout


# --------------------------------------------------------------------------------- rerun, runs, report records
@pytest.fixture
def record(smoke_run, tmp_path) -> Path:
    """A copy of the smoke run's directory, to damage as an attacker would."""
    copy = tmp_path / "record"
    shutil.copytree(smoke_run[1], copy)
    return copy


@pytest.mark.slow
def test_a_recorded_lookup_or_callback_is_not_rerun(record, tmp_path):
    config = record / ".hydra" / "config.yaml"
    text = config.read_text()
    config.write_text(text.replace("prompts:\n", f"prompts:\n  negative: '{LOOKUP}'\n", 1)
                      .replace("  negative: null\n", "", 1))
    result = run_cli(str(record), "--no-tracking", cwd=tmp_path, env=ENV, command="rerun")
    assert_one_line_error(result, f"error: {config}: prompts.negative is '{LOOKUP}', a resolver call the packaged "
                                  "config does not make there")
    config.write_text(text)
    (record / ".hydra" / "overrides.yaml").write_text("- +experiment=smoke\n- +hydra.callbacks.x._target_=os.getcwd\n")
    result = run_cli(str(record), "--no-tracking", cwd=tmp_path, command="rerun")
    assert_one_line_error(result, f"error: {record / '.hydra' / 'overrides.yaml'}: a _target_")
    assert nothing_written(tmp_path) and SECRET not in result.stderr


@pytest.mark.slow
def test_records_that_point_outside_or_explode_are_one_line(record, tmp_path):
    images = record / "images.json"
    entries = json.loads(images.read_text())
    entries[0]["file"] = "../../../../../../etc/passwd"
    images.write_text(json.dumps(entries))
    result = run_cli(str(record), "--no-tracking", cwd=tmp_path, command="rerun")
    assert_one_line_error(result, f"error: {images}: names the image file '../../../../../../etc/passwd', outside "
                                  "its run directory")
    images.write_text("[" * 100_000 + "]" * 100_000)  # RecursionError in Python's json, before
    assert_one_line_error(run_cli(str(record), "--no-tracking", cwd=tmp_path, command="rerun"),
                          f"error: {images}: is nested deeper than Python can read")
    other = tmp_path / "other"
    shutil.copytree(record, other)
    (other / ".hydra" / "config.yaml").write_text(ALIAS_BOMB)
    started = time.monotonic()
    diff = run_cli("diff", str(record), str(other), "--no-images", cwd=tmp_path, command="runs")
    assert diff.returncode == 0 and "Traceback" not in diff.stderr, diff.stderr
    assert "B's .hydra/config.yaml cannot be read (UnreadableRecord: uses a YAML alias (*a)" in diff.stdout
    listed = run_cli("list", str(tmp_path), cwd=tmp_path, command="runs")
    assert listed.returncode == 0 and listed.stdout.count("FINISHED") == 2, listed.stdout
    assert_one_line_error(run_cli(str(other), "--no-tracking", cwd=tmp_path, command="rerun"),
                          f"error: {other / '.hydra' / 'config.yaml'}: cannot be read (uses a YAML alias (*a)")
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_a_records_text_reaches_the_terminal_escaped(record, tmp_path):
    status = json.loads((record / "status.json").read_text())
    status["run_name"] = "evil\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\rname"
    (record / "status.json").write_text(json.dumps(status))
    listed = run_cli("list", str(tmp_path), cwd=tmp_path, command="runs")
    assert listed.returncode == 0, listed.stderr
    assert not any(c in listed.stdout for c in "\x1b\x07\u202e\r")
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202egnp.exe\\rname" in listed.stdout


def test_report_reads_only_well_formed_sweep_records(tmp_path):
    sweep = crafted_sweep(tmp_path, ["seed=0,1"], [])
    (sweep / "sweep.json").write_text(json.dumps({"swept_keys": "seed"}))
    assert_one_line_error(run_cli(str(sweep), cwd=tmp_path, command="report"),
                          f"error: {sweep / 'sweep.json'}: has swept_keys that is not a list of texts")
    (sweep / "sweep.json").unlink()
    (sweep / "multirun.yaml").write_text("hydra: !!python/object/apply:os.system [echo RAN]\n")
    result = run_cli(str(sweep), cwd=tmp_path, command="report")
    assert_one_line_error(result, f"error: {sweep / 'multirun.yaml'}: cannot be read (cannot be read as YAML")
    assert "RAN" not in result.stdout


# ------------------------------------------------------------------------------------------ run directories
def test_a_named_run_directory_must_be_new_or_empty_and_a_refused_run_leaves_none(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    assert_one_line_error(run_cli("+experiment=smoke", f"hydra.run.dir={full}", cwd=tmp_path),
                          f"error: hydra.run.dir: {full} is not empty (it holds notes.txt)")
    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nowhere")
    assert_one_line_error(call_cli("+experiment=smoke", f"hydra.run.dir={dangling}/run", cwd=tmp_path),
                          f"error: hydra.run.dir: {dangling}/run cannot be made: {dangling} is a symbolic link to "
                          "nothing, not a folder")
    # Refused by our checks after Hydra made the directory, or by Hydra while composing: no run either way.
    for bad in ("sampling.guidance_scale=nan", "+sampling.no_such_key=1", "sampling.no_such_key=1"):
        result = call_cli("+experiment=smoke", bad, f"hydra.run.dir={tmp_path / 'runs' / 'refused'}", cwd=tmp_path)
        assert result.returncode == 2 and not (tmp_path / "runs").exists(), (bad, result.stderr)


# ------------------------------------------------------------------- round five: what a resume replays, links
def test_resume_drops_launcher_settings_that_start_programs_and_says_so(tmp_path, basic_seed_sweep):
    """The round-five case: a sweep folder whose multirun.yaml puts the folder's own bin/ first on the workers'
    PATH (its `git` would have run in every worker), with submitit's setup lines and a batch-script comment that
    ends its line. None is replayed; one line names them; the counts and resources are kept; the command line
    can give them again, and only launcher settings."""
    from sdjax_runner.commands.resume import recorded_command

    sweep = tmp_path / "sweep"
    shutil.copytree(basic_seed_sweep, sweep)
    (sweep / "bin").mkdir()
    marker = tmp_path / "git-ran"
    (sweep / "bin" / "git").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (sweep / "bin" / "git").chmod(0o755)
    record = yaml.safe_load((sweep / "multirun.yaml").read_text())
    planted = [f"+hydra.launcher.env.PATH={sweep}/bin:/usr/bin", "+hydra.launcher.setup=[touch_x]",
               "+hydra.launcher.comment='x\nrm -rf ~'", "+hydra.launcher.address=10.1.2.3:6379"]
    record["hydra"]["overrides"]["hydra"] += planted
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(record))

    argv, _, dropped = recorded_command(sweep)
    assert dropped == ["hydra.launcher.env.PATH", "hydra.launcher.setup", "hydra.launcher.comment",
                       "hydra.launcher.address"]
    assert not any("hydra.launcher" in a for a in argv)
    argv, _, dropped = recorded_command(sweep, ["hydra/launcher=ray", "hydra.launcher.num_workers=3"])
    assert argv.count("hydra/launcher=ray") == 1 and "hydra.launcher.num_workers=3" in argv
    with pytest.raises(ValueError, match="is not a launcher setting; a resumed sweep keeps its points"):
        recorded_command(sweep, ["seed=9"])
    kept = record["hydra"]["overrides"]["hydra"][:-len(planted)] + ["hydra.launcher.num_workers=2",
                                                                     "hydra.launcher.resources={GPU: 1}"]
    from sdjax_runner.config.overrides import launcher_settings_replayed
    assert launcher_settings_replayed(kept) == (kept, [])

    result = call_cli("resume", str(sweep), cwd=tmp_path)  # every job finished: nothing runs, the line is said
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "not replayed" in x)
    assert line == (f"resume: not replayed from {sweep / 'multirun.yaml'}: hydra.launcher.env.PATH, "
                    "hydra.launcher.setup, hydra.launcher.comment, hydra.launcher.address (launcher settings that "
                    "can start a program, change a process's environment or send the work elsewhere are taken "
                    "from the command line: resume SWEEP_DIR hydra.launcher.KEY=VALUE)")
    assert not marker.exists() and "hydra.launcher.env" not in result.stdout.split(line)[1]


LINKED = ("report.html.tmp", "sweep.json.tmp", "summary.json.tmp", "0/status.json.tmp", "0/images.json.tmp",
          "report.html", "summary.csv", "summary.json", "contact_sheet.png", "report.png")


def test_report_replaces_links_in_a_sweep_folder_and_never_writes_through_them(tmp_path, basic_seed_sweep):
    """Round five: `report` wrote NAME.tmp then renamed it, so a report.html.tmp link in a handed sweep folder
    made it overwrite the link's target (a file in the home directory got the report's HTML). Links at the
    temporary names and at the final names themselves: the victim is untouched, each record a regular file."""
    sweep = tmp_path / "sweep"
    shutil.copytree(basic_seed_sweep, sweep)
    victim = tmp_path / "home-file"
    victim.write_text("precious")
    for name in LINKED:
        (sweep / name).unlink(missing_ok=True)
        (sweep / name).symlink_to(victim)
    result = call_cli(str(sweep), cwd=tmp_path, command="report")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious"
    assert (sweep / "report.html").is_file() and not (sweep / "report.html").is_symlink()  # replaced, not followed
    assert "<html" in (sweep / "report.html").read_text().lower()
    assert all((sweep / name).is_symlink() for name in LINKED if name != "report.html")  # what report does not write


def test_resume_refuses_a_sweep_folder_with_links_where_it_writes(tmp_path, basic_seed_sweep):
    victim = tmp_path / "home-file"
    victim.write_text("precious")
    for name in ("multirun.yaml", "0/status.json", "3/run.log", "1/.hydra/config.yaml", "2"):
        sweep = tmp_path / "sweep"
        shutil.rmtree(sweep, ignore_errors=True)
        shutil.copytree(basic_seed_sweep, sweep)
        target = sweep / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        target.symlink_to(victim)
        before = tree(tmp_path)
        assert_one_line_error(call_cli("resume", str(sweep), cwd=tmp_path),
                              f"error: SWEEP_DIR: {target} is a link, and a resume writes there")
        assert tree(tmp_path) == before and victim.read_text() == "precious"


def test_files_are_written_whole_beside_their_name_never_through_a_link(tmp_path):
    from sdjax_runner import files

    tmp_path = tmp_path / "folder"
    tmp_path.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in ("a.json", "a.json.tmp", f".a.json.{__import__('os').getpid()}.tmp"):
        (tmp_path / name).symlink_to(victim)
    files.write_json(tmp_path / "a.json", {"x": 1})
    files.write_private(tmp_path / "key", b"k")
    assert victim.read_text() == "precious" and json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert not (tmp_path / "a.json").is_symlink() and (tmp_path / "key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~files._umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a.json", "a.json.tmp", f".a.json.{__import__('os').getpid()}.tmp", "key", "victim"])  # nothing left over
