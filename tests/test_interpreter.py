"""The interpreter's own costs: collection paused while a job starts (and nothing kept for good), and
an exit without teardown that still flushes, runs exit handlers, keeps the exit code and waits for
working threads."""

import gc
import subprocess
import sys
import textwrap
import weakref

import pytest

from sdjax_runner import interpreter


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


class Cycle:
    def __init__(self):
        self.me = self


def test_start_up_objects_are_exempt_until_the_job_ends_then_collected(tmp_path):
    assert gc.isenabled()
    before = gc.get_freeze_count()  # Python 3.12 starts with a few hundred objects frozen
    try:
        interpreter.pause_collection()
        assert not gc.isenabled()
        garbage = Cycle()
        collected = weakref.ref(garbage)
        del garbage  # unreachable, but only the cyclic collector frees it
        interpreter.program_ready()
        assert gc.isenabled() and gc.get_freeze_count() > before
        gc.collect()
        assert collected() is not None  # frozen: left out of collections while the job runs
        interpreter.job_ended()
        assert gc.get_freeze_count() <= before  # nothing the job froze stays frozen
        gc.collect()
        assert collected() is None  # collected as usual afterwards: nothing is kept for good
    finally:
        interpreter.job_ended()
    assert gc.isenabled()


def test_a_job_that_fails_before_its_program_is_ready_gets_collection_back():
    before = gc.get_freeze_count()
    interpreter.pause_collection()
    interpreter.job_ended()  # what runner.run's and cli.main's finally blocks do
    assert gc.isenabled() and gc.get_freeze_count() == before


def test_collection_someone_else_disabled_stays_disabled():
    gc.disable()
    try:
        interpreter.pause_collection()
        interpreter.program_ready()
        interpreter.job_ended()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_quick_exit_flushes_runs_exit_handlers_and_keeps_the_code(tmp_path):
    result = _python("""
        import atexit, pathlib, sys
        from sdjax_runner.interpreter import exit_process
        atexit.register(lambda: pathlib.Path("atexit.txt").write_text("ran"))
        sys.stdout.write("buffered, no newline")
        sys.stderr.write("to stderr")
        exit_process(3)
        print("not reached")
    """, tmp_path)
    assert result.returncode == 3
    assert result.stdout == "buffered, no newline" and result.stderr == "to stderr"
    assert (tmp_path / "atexit.txt").read_text() == "ran"


def test_the_quick_exit_waits_for_a_thread_still_working(tmp_path):
    result = _python("""
        import pathlib, threading, time
        from sdjax_runner.interpreter import exit_process
        def work():
            time.sleep(0.5)
            pathlib.Path("done.txt").write_text("done")
        threading.Thread(target=work).start()
        exit_process(0)
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "done.txt").read_text() == "done"


def test_exit_codes_as_sys_exit_reads_them(tmp_path):
    for code, expected_rc, expected_err in [("None", 0, ""), ("'error: text'", 1, "error: text\n"), ("130", 130, "")]:
        result = _python(f"from sdjax_runner.interpreter import exit_process; exit_process({code})", tmp_path)
        assert (result.returncode, result.stderr) == (expected_rc, expected_err)


@pytest.mark.slow
def test_the_cli_run_ends_with_its_outputs_whole(smoke_run):
    _work, run_dir, result = smoke_run
    assert result.returncode == 0
    assert "write: 8 image(s) + grid" in result.stdout + result.stderr
    assert (run_dir / "run.log").read_text().rstrip().splitlines()[-1].split("] ", 1)[1].startswith("track: mlflow run")
