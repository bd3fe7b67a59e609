"""What a user sees of the settings that ran (issue #44): the sampler as A1111 spells it in the plan line,
run names and directories, ``runs list`` and MLflow's params; a sweep's names, summary and report; A1111
syntax in a plain prompt said once; each merged LoRA said; runs refused for bad input kept out of ``runs
list``; a sampler's name given to ``scheduler=``; from_png's Dtype, Batch and Device."""

from __future__ import annotations

import collections
import csv
import json
from pathlib import Path

import pytest

from helpers.browser import open_page
from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.lora_files import factors, write_kohya
from helpers.mlflow_store import seed_store

HINT = "looks like A1111's prompt syntax"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, mlflow_template):
    """(work directory, LoRA updates, results): three runs into one outputs/ -- a sampler named as A1111 names
    it with A1111 syntax in a plain prompt file (logged to MLflow), a LoRA run, and a run refused once its
    model is loaded (a size the model cannot take)."""
    work = tmp_path_factory.mktemp("shown")
    seed_store(work, mlflow_template)
    prompts = work / "prompts.txt"
    prompts.write_text("a (red:1.3) cat\nBREAK a dog\n", encoding="utf-8")
    updates = factors(tiny_model_dir, rank=2)
    lora = write_kohya(work / "style.safetensors", updates, alpha=1.0)
    results = {
        "sampler": run_cli("+experiment=smoke", "sampler=DPM++ 2M Karras", f"prompts.file={prompts}", cwd=work),
        "lora": run_cli("+experiment=smoke", "tracking=none", f"lora=[{{path: {lora}, scale: 0.8}}]", cwd=work),
        "refused": run_cli("+experiment=smoke", "tracking=none", "sampling.height=72", cwd=work),
    }
    for name in ("sampler", "lora"):
        assert results[name].returncode == 0, results[name].stderr
    return work, updates, results


def _run_dirs(work: Path) -> dict[str, Path]:
    """Each run directory under outputs/runs by the run name its status.json gives."""
    found = {}
    for status in (work / "outputs" / "runs").glob("*/*/status.json"):
        found[json.loads(status.read_text())["run_name"]] = status.parent
    return found


@pytest.mark.slow
def test_the_plan_line_names_the_sampler_and_a1111_syntax_in_a_plain_prompt_is_said_once(runs):
    _, _, results = runs
    said = results["sampler"].stdout + results["sampler"].stderr
    assert "plan: 8 image(s) = 1 batch(es) x 8 device(s) x 1 per device; tiny-random fp32, DPM++ 2M Karras 4 steps" \
        in said
    assert "tiny-random fp32, pndm 4 steps" in results["lora"].stdout  # no sampler: the diffusers scheduler's name
    [hint] = [line for line in said.splitlines() if HINT in line]
    assert "prompts.file (prompt 1) (and 1 more prompt(s))" in hint and "'(red:1.3)'" in hint
    assert "prompts.syntax=a1111" in hint
    lora_said = results["lora"].stdout + results["lora"].stderr
    assert HINT not in lora_said  # the guide's prompt: plain text, nothing to say


@pytest.mark.slow
def test_run_names_directories_and_mlflow_show_what_ran(runs):
    from mlflow.tracking import MlflowClient

    work, _, _ = runs
    dirs = _run_dirs(work)
    sampler_name = "smoke sampler=DPM++ 2M Karras prompts.file=prompts.txt"
    lora_name = "smoke lora=style.safetensors@0.8"
    assert {sampler_name, lora_name} <= set(dirs), dirs
    assert dirs[sampler_name].name.endswith("_smoke_sampler=DPM++_2M_Karras_prompts.file=prompts.txt")
    assert dirs[lora_name].name.endswith("_smoke_lora=style.safetensors@0.8")

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sdjax-runner")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == sampler_name
    assert run.data.params["sampler"] == "DPM++ 2M Karras"
    found = client.search_runs([experiment.experiment_id], "params.sampler = 'DPM++ 2M Karras'")
    assert [r.info.run_id for r in found] == [run.info.run_id]


@pytest.mark.slow
def test_a_merged_lora_is_one_line_per_file(runs):
    _, updates, results = runs
    touched = collections.Counter(component for component, _ in updates)
    parts = ", ".join(f"{component} {count}" for component, count in sorted(touched.items()))
    assert f"lora: style.safetensors at scale 0.8 merged into {len(updates)} layer(s) ({parts})" \
        in results["lora"].stdout


@pytest.mark.slow
def test_runs_list_shows_the_sampler_and_leaves_runs_refused_for_bad_input_out(runs):
    work, _, results = runs
    assert_one_line_error(results["refused"], "error: sampling.height: 72 does not fit tiny-random's down-sampling")
    refused_dir = _run_dirs(work)["smoke sampling.height=72"]
    status = json.loads((refused_dir / "status.json").read_text())
    assert status["status"] == "FAILED" and status["refused"] is True  # FAILED for the tracker, refused for runs list

    listing = run_cli("list", cwd=work, command="runs")
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:6] == ["started", "status", "name", "model", "dtype", "sampler"]
    assert len(rows) == 2 and not any("REFUSED" in row or "FAILED" in row for row in rows)
    assert "(1 run(s) refused for bad input not shown: nothing was generated; --refused lists them)" in listing.stderr
    by_name = {next(n for n in ("sampler=DPM", "lora=") if n in row): row for row in rows}
    assert "DPM++ 2M Karras" in by_name["sampler=DPM"].split("prompts.file=prompts.txt", 1)[1]
    assert " pndm " in by_name["lora="]

    everything = run_cli("list", "--refused", cwd=work, command="runs")
    assert everything.returncode == 0 and everything.stderr == "", everything.stderr
    assert len(everything.stdout.splitlines()) == 4
    [refused_row] = [row for row in everything.stdout.splitlines() if "REFUSED" in row]
    assert "smoke sampling.height=72" in refused_row

    def dirs(*filters: str) -> list[str]:
        result = run_cli("list", "--dirs", *filters, cwd=work, command="runs")
        assert result.returncode == 0, result.stderr
        return [Path(line).name for line in result.stdout.splitlines()]

    assert dirs("status=REFUSED") == [refused_dir.name]  # asking for them by status lists them
    assert dirs("sampler=DPM++ 2M*") == dirs("sampler=DPM++ 2M Karras") == [_run_dirs(work)[
        "smoke sampler=DPM++ 2M Karras prompts.file=prompts.txt"].name]
    assert dirs("sampler=pndm") == [_run_dirs(work)["smoke lora=style.safetensors@0.8"].name]


def test_a_sampler_given_to_scheduler_points_at_sampler(tmp_path):
    allowed = ("beta, ddim, ddpm, dpm_solver_pp, euler, exponential, flow_match_euler, karras, lcm, lms, normal, pndm, "
               "sgm_uniform, simple")
    assert_one_line_error(call_cli("+experiment=smoke", "scheduler=heun", cwd=tmp_path),
                          f"error: scheduler=heun: no such option (allowed: {allowed}; heun is a sampler: "
                          "sampler=heun)")
    assert_one_line_error(call_cli("+experiment=smoke", "scheduler=DPM++ 2M Karras", cwd=tmp_path),
                          f"error: scheduler=DPM++ 2M Karras: no such option (allowed: {allowed}; DPM++ 2M Karras is "
                          "a sampler: sampler='DPM++ 2M Karras')")
    assert_one_line_error(call_cli("+experiment=smoke", "scheduler=bogus", cwd=tmp_path),
                          f"error: scheduler=bogus: no such option (allowed: {allowed})")
    assert not (tmp_path / "outputs" / "runs").exists()  # refused before a run directory was made


@pytest.mark.parametrize("dtype, said", [
    ("float32", "from_png: Dtype: float32 -> dtype=fp32"),  # our PNGs write the weights' dtype
    ("bf16", "from_png: Dtype: bf16 -> dtype=bf16"),
    ("int8", "from_png: not honoured: Dtype: int8: no dtype option of that name, the run's own dtype runs "
             "(allowed: bf16, fp16, fp32; give dtype=NAME)"),
])
def test_from_png_says_its_dtype_batch_and_device(tmp_path, dtype, said):
    text = ("a cat\nSteps: 4, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 64x64, Model: tiny-random, "
            f"Dtype: {dtype}, Batch: 1, Device: 3")
    # A height the runner refuses: the run stops before anything loads, after from_png has said its lines.
    cli = run_cli if dtype == "float32" else call_cli  # one in a process of its own
    result = cli("--infotext", text, "+experiment=smoke", "sampling.height=65", cwd=tmp_path, command="from_png")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert said in lines
    for key, place in (("Batch", "batch 1"), ("Device", "device 3")):
        assert (f"from_png: not honoured: {key}: {place.split()[1]}: where this image sat in the run that made it; "
                f"this run lays out its images by parallelism.* (the same layout remakes it at {place})") in lines


@pytest.fixture(scope="module")
def sampler_sweep(tmp_path_factory, tiny_model_dir):
    """(sweep directory, result) of a sweep over two samplers, one by ComfyUI's name and one by A1111's, the
    first the reference point; its negative prompt in A1111's syntax, read as plain text."""
    work = tmp_path_factory.mktemp("sampler-sweep")
    sweep = work / "sweep"
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "sampler=euler_ancestral,DPM++ 2M Karras",
                     "+metrics.reference_point={sampler: euler_ancestral}", "prompts.negative='(blurry:1.2)'",
                     f"hydra.sweep.dir={sweep}", cwd=work)
    assert result.returncode == 0, result.stderr
    return sweep, result


@pytest.mark.slow
def test_a1111_syntax_in_a_plain_prompt_is_said_once_in_a_sweep(sampler_sweep):
    _, result = sampler_sweep
    [hint] = [line for line in (result.stdout + result.stderr).splitlines() if HINT in line]
    assert "prompts.negative looks like A1111's prompt syntax ('(blurry:1.2)')" in hint


@pytest.mark.slow
@pytest.mark.browser
def test_a_sweeps_names_summary_and_report_show_the_samplers_as_a1111_spells_them(sampler_sweep):
    sampler_sweep, _ = sampler_sweep
    names = [json.loads((sampler_sweep / job / "status.json").read_text())["run_name"] for job in ("0", "1")]
    assert names == ["smoke sampler=euler_ancestral", "smoke sampler=DPM++ 2M Karras"]  # as given, no escapes
    with open(sampler_sweep / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["sampler"] for r in rows] == ["Euler a", "DPM++ 2M Karras"]
    assert rows[0]["psnr"] == "" and float(rows[1]["psnr"]) > 0  # the reference point found by its given name

    with open_page((sampler_sweep / "report.html").as_uri()) as opened:
        page = opened.page
        assert opened.console_errors == []
        assert page.locator("th.x-label").all_inner_texts() == ["sampler=Euler a", "sampler=DPM++ 2M Karras"]
        table = page.locator("table.points")
        headers = table.locator("thead th").all_inner_texts()
        assert headers[1] == "sampler"
        assert table.locator("tbody td:nth-child(2)").all_inner_texts() == ["Euler a", "DPM++ 2M Karras"]
        for metric in ("PSNR (dB)", "SSIM"):
            cells = table.locator(f"tbody td:nth-child({headers.index(metric) + 1})").all_inner_texts()
            assert cells[0] == "reference" and float(cells[1]) > 0
        assert page.locator("td.cell[data-job='0'] .caption").inner_text().endswith("reference · grid")
