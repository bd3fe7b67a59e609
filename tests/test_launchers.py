"""The sweep launchers' own logic, without a cluster (sdjax_runner/launchers/, config/launchers.py): which
point a free worker takes, how points are split into array tasks, what a point whose worker died leaves on
disk, and the one-line refusals a Ray sweep gives before it writes anything."""

from __future__ import annotations

import json
import time

import pytest
from omegaconf import OmegaConf

from helpers.cli import assert_one_line_error, call_cli, free_port, run_cli
from sdjax_runner.launchers.workers import Point, finish_lost_point, next_point, program_signature, shares


def point(number: int, signature: str) -> Point:
    return Point(number, [f"seed={number}"], OmegaConf.create({}), signature)


def test_a_free_worker_takes_a_point_of_its_program_else_a_program_nobody_holds_else_the_next():
    pending = [point(0, "a"), point(1, "b"), point(2, "c"), point(3, "b")]
    assert next_point(pending, held={"b"}, held_elsewhere=set()).number == 1
    assert next_point(pending, held=set(), held_elsewhere={"a"}).number == 1
    assert next_point(pending, held=set(), held_elsewhere={"a", "b", "c"}).number == 0  # never idle
    assert next_point([], held=set(), held_elsewhere=set()) is None


def test_array_task_shares_keep_a_program_together_and_stay_balanced():
    points = [point(i, "ab"[i % 2]) for i in range(7)]  # two programs, interleaved in job order
    split = shares(points, 2)
    assert [[p.number for p in share] for share in split] == [[0, 2, 4, 6], [1, 3, 5]]
    assert [len(share) for share in shares(points, 3)] == [3, 2, 2]
    assert len(shares(points[:2], 5)) == 2  # never an empty task


def test_the_program_signature_ignores_traced_inputs_and_records_but_not_what_shapes_the_program():
    base = {"seed": 0, "run_name": "a", "prompts": {"texts": ["x"], "max_sequence_length": 512},
            "sampling": {"guidance_scale": 7.5, "num_inference_steps": 4}, "model": {"name": "tiny"},
            "hydra": {"job": {"num": 0}}}
    other = json.loads(json.dumps(base))
    other.update(seed=5, run_name="b", hydra={"job": {"num": 3}})
    other["prompts"]["texts"], other["sampling"]["guidance_scale"] = ["y"], 3.0
    assert program_signature(OmegaConf.create(base)) == program_signature(OmegaConf.create(other))
    for key, subkey, value in (("sampling", "num_inference_steps", 8), ("prompts", "max_sequence_length", 256),
                               ("model", "name", "other")):
        changed = json.loads(json.dumps(base))
        changed[key][subkey] = value
        assert program_signature(OmegaConf.create(changed)) != program_signature(OmegaConf.create(base)), key


def test_a_lost_point_that_never_started_is_a_failed_row_with_its_values(tmp_path):
    from sdjax_runner.record.sweep import collect_jobs

    lost = Point(3, ["+experiment=smoke", "seed=3"], OmegaConf.create({}), "a")
    assert finish_lost_point(lost, tmp_path, "no Ray worker was left to run it") == "FAILED"
    [row] = collect_jobs(tmp_path, ["seed"])
    assert row["job"] == 3 and str(row["seed"]) == "3" and row["status"] == "FAILED"
    assert row["error"] == "not run: no Ray worker was left to run it"


def test_a_lost_point_left_running_is_finished_killed_with_its_images_kept(tmp_path):
    job = tmp_path / "0"
    (job / "images").mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"status": "RUNNING", "host": "elsewhere", "pid": 1}))
    assert finish_lost_point(point(0, "a"), tmp_path, "its worker died") == "KILLED"
    status = json.loads((job / "status.json").read_text())
    assert status["status"] == "KILLED" and "its worker died" in status["error"]


def test_a_ray_address_that_does_not_answer_is_one_line_before_anything_is_written(tmp_path):
    started = time.monotonic()
    result = run_cli("-m", "+experiment=smoke", "seed=0,1", "hydra/launcher=ray",
                     f"hydra.launcher.address=127.0.0.1:{free_port()}", "hydra.launcher.connect_timeout_s=2",
                     cwd=tmp_path)
    assert time.monotonic() - started < 60
    assert_one_line_error(result, "error: hydra.launcher.address: the Ray cluster at 127.0.0.1:")
    assert "cannot be reached" in result.stderr
    assert not (tmp_path / "outputs" / "multiruns").exists()


@pytest.mark.parametrize(("override", "expected"), [
    ("hydra.launcher.num_workers=0", "error: hydra.launcher.num_workers: must be a whole number >= 1, got 0"),
    ("hydra.launcher.resources={CPU:-1}", "error: hydra.launcher.resources: must name what one worker takes"),
    ("hydra.launcher.address='not an address'", "error: hydra.launcher.address: is not a Ray cluster address"),
    # round five: each waited (150 s and more, or the 300 s start timeout) or was a traceback
    ("hydra.launcher.num_workers=100000", "error: hydra.launcher.num_workers: 100000 workers for a sweep of 2 "
                                          "point(s) (allowed: 1..2)"),
    ("hydra.launcher.resources=abc", "error: hydra.launcher.resources: must name what one worker takes, got abc"),
    ("hydra.launcher.resources={TPU:1e9}", "error: hydra.launcher.resources: must name what one worker takes, got "
                                           "{'TPU': 1000000000.0} (allowed: {CPU: 1}, {GPU: 1}, {TPU: 4}"),
])
def test_bad_ray_settings_are_one_line(tmp_path, override, expected):
    cli = run_cli if override.endswith("=0") else call_cli  # one in a process of its own: the exit code, no traceback
    started = time.monotonic()
    result = cli("-m", "+experiment=smoke", "seed=0,1", "hydra/launcher=ray", override, cwd=tmp_path)
    assert_one_line_error(result, expected)
    assert not (tmp_path / "outputs" / "multiruns").exists() and time.monotonic() - started < 30


def test_bad_array_launcher_settings_are_one_line_before_any_task_is_submitted(tmp_path):
    empty = tmp_path / "no-slurm"
    empty.mkdir()
    for launcher, extra, env, expected in (
            ("local_workers", ["hydra.launcher.num_workers=5"], None,
             "error: hydra.launcher.num_workers: 5 workers for a sweep of 2 point(s) (allowed: 1..2)"),
            ("slurm_workers", [], {"PATH": str(empty)}, "error: hydra/launcher: slurm_workers submits its array tasks "
             "with SLURM's sbatch (and runs them with srun), which this machine's PATH does not have (allowed: "
             "slurm_workers on a SLURM login node, or hydra/launcher=local_workers")):
        result = call_cli("-m", "+experiment=smoke", "seed=0,1", f"hydra/launcher={launcher}", *extra, cwd=tmp_path,
                          env=env)
        assert_one_line_error(result, expected)
        assert not (tmp_path / "outputs" / "multiruns").exists()


def test_a_launcher_whose_library_is_missing_names_its_extra(tmp_path):
    hide = tmp_path / "hide"  # as if ray were not installed: our plugin registers hydra/launcher=ray only with it
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.util\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a, **k: None if name == 'ray' else _find(name, *a, **k)\n")
    result = run_cli("-m", "+experiment=smoke", "hydra/launcher=ray", "seed=0,1", cwd=tmp_path,
                     env={"PYTHONPATH": str(hide)})
    assert_one_line_error(result, "error: hydra/launcher=ray: the launcher is not installed "
                                  "(pip install 'sdjax-runner[ray]'; allowed now: basic, joblib, local_workers,")


def test_a_worker_that_does_not_read_the_commands_probe_says_why(tmp_path):
    from sdjax_runner.launchers.workers import SweepWorker, remove_probe, write_probe

    worker = SweepWorker.__new__(SweepWorker)  # its checks only: no Hydra state or process set up
    worker.cannot_see = None
    token = write_probe(tmp_path)
    assert worker.check_sees(str(tmp_path), token) is None
    assert worker.check_sees(str(tmp_path), "another") == f"reads another {tmp_path / '.workers_probe'} (not the same folder)"
    remove_probe(tmp_path)
    assert "is missing" in worker.check_sees(str(tmp_path), token)
    worker.cannot_see = "cannot enter the command's working directory /nowhere (No such file or directory)"
    assert worker.check_sees(str(tmp_path), token) == worker.cannot_see
