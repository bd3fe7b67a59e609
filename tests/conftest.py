"""Shared fixtures. JAX sees 8 CPU devices, so replication and sharding really run."""

import os

# Must happen before anything imports JAX (and reaches every process a test starts, through the environment).
# 8 CPU devices, so replication and sharding really run; and XLA's CPU backend without its LLVM optimizations:
# the tests check what programs compute, never how fast they run, and compiling is most of the suite's time
# (~5 s for each new program of a tiny model): a fifth off the suite. Speed is measured in benchmarks/, built as a
# user builds.
# (tests/helpers/compile_options.py: a user's options, for a program compared bit for bit with a user's output.)
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8",
                                    "--xla_backend_optimization_level=0",
                                    "--xla_llvm_disable_expensive_passes=true"]).strip()
os.environ.pop("MLFLOW_TRACKING_URI", None)

import sys

# An environment that asks Python not to write bytecode (PYTHONDONTWRITEBYTECODE, as this project's machines and CI
# set it) makes every process compile what it imports from source each time: the package's ~200 modules, 0.6 s a
# process, and pytest's assertion rewriting of the tests, ~10 s a worker. The suite writes it (into the checkout's
# __pycache__ folders, ignored by git; the installed libraries have theirs from pip): a test worker's imports then
# serve the other worker, every process a test starts and the next run. Python checks each file's size and time
# before it uses its bytecode, as it always does.
if sys.dont_write_bytecode:
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import signal

# A suite started in the background of a shell (`pytest ... &`, nohup, some CI runners) inherits SIGINT ignored,
# and so would every process a test starts: a Ctrl-C test's run would finish instead of stopping. The tests run as
# from a terminal, where Ctrl-C interrupts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from pathlib import Path

import pytest

from helpers.cli import restore_signal_handlers, run_cli, signal_handlers
from helpers.mlflow_store import seed_store
from sdjax_runner.engine.runtime import silence_libraries

silence_libraries()  # the guide code run in-process logs Flax deprecation notices too

# The tiers (pyproject.toml's markers; docs/getting-started.md, "Test tiers"): the fast tier is
# pytest -m "not slow and not browser and not server". Tests are marked where they are written; as a safety
# net, a test that asks for a fixture which builds a model or runs the CLI on one (directly or through a
# fixture of its own) is marked slow here too, so a new test of that kind never lands in the fast tier.
MODEL_FIXTURES = {"tiny_model_dir", "tiny_xl_dir", "smoke_run"}


def pytest_collection_modifyitems(items):
    # SDJAX_TEST_ORDER=reverse runs the tests in the reverse of their order (docs/getting-started.md, "Test
    # tiers"): a test that leans on another's leftovers, or leaves process state behind, shows itself.
    if os.environ.get("SDJAX_TEST_ORDER") == "reverse":
        items.reverse()
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


# XLA's CPU backend maps each compiled kernel's code into memory of its own -- three mappings a kernel, some 500 for
# the smoke run's program -- and a test worker that keeps what hundreds of tests compiled reaches the kernel's limit
# on a process's mappings (vm.max_map_count, 65,530 by default): XLA's next mmap then fails and the worker dies in a
# compile or a serialize (a segfault, seen twice at 97% of the suite). After a module that leaves the process holding
# more than half of the limit, what keeps compiled programs alive is let go -- the engine (its models and programs:
# engine/reuse.py), the CLIP scorers, JAX's own caches -- and a later test compiles (or loads) again.
MAPPINGS_SHARE = 0.5


def mappings() -> tuple[int, int]:
    """(this process's memory mappings, the most it may have); (0, 1) where /proc does not say."""
    try:
        with open(f"/proc/{os.getpid()}/maps", "rb") as maps:
            count = sum(1 for _ in maps)
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 0, 1
    return count, limit


@pytest.fixture(scope="module", autouse=True)
def compiled_code_bounded(request):
    """``SDJAX_TEST_MAPPINGS=FILE``: each module's mappings, and those once let go, appended to FILE."""
    yield
    count, limit = mappings()
    log = os.environ.get("SDJAX_TEST_MAPPINGS")
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} {request.module.__name__} {count} {limit}\n")
    if count > MAPPINGS_SHARE * limit:
        import gc

        import jax

        from sdjax_runner import process

        state = process.current()
        state.engine = None
        state.clip_scorers.clear()
        jax.clear_caches()
        gc.collect()
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()} let go: {mappings()[0]}\n")


COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace", "/jax/core/compile/jaxpr_to_mlir_module_duration":
                  "lower", "/jax/core/compile/backend_compile_duration": "compile"}


@pytest.fixture(autouse=True)
def compile_time_logged(request):
    """``SDJAX_TEST_COMPILE_LOG=FILE``: each test's seconds of JAX tracing, lowering and XLA compiling in this
    process (jax.monitoring's events; a process a test starts is not counted), appended to FILE: where the suite's
    time goes."""
    log = os.environ.get("SDJAX_TEST_COMPILE_LOG")
    if not log:
        yield
        return
    import jax

    spent = dict.fromkeys(COMPILE_EVENTS.values(), 0.0)

    def listener(event: str, duration: float, **_) -> None:
        if event in COMPILE_EVENTS:
            spent[COMPILE_EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        try:
            jax.monitoring.unregister_event_duration_listener(listener)
        except AssertionError:  # a test cleared JAX's listeners
            pass
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{request.node.nodeid}\t" + "\t".join(f"{spent[k]:.2f}" for k in spent) + "\n")


@pytest.fixture(autouse=True)
def cpu_time_logged(request):
    """``SDJAX_TEST_CPU_LOG=FILE``: each test's wall seconds and the CPU seconds this worker and the processes it
    waited for spent in it (user + system; a daemon a test starts and does not wait for is not counted), appended to
    FILE: the tests that wait rather than compute, where two workers leave a core idle."""
    log = os.environ.get("SDJAX_TEST_CPU_LOG")
    if not log:
        yield
        return
    import resource
    import time

    def cpu() -> float:
        return sum(usage.ru_utime + usage.ru_stime for usage in
                   (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))

    started, spent = time.perf_counter(), cpu()
    yield
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"{request.node.nodeid}\t{time.perf_counter() - started:.2f}\t{cpu() - spent:.2f}\n")


@pytest.fixture(autouse=True)
def signals_restored():
    """Every test leaves the signal handlers as it found them: a handler a library set in this process (SIGINT
    ignored, SIGPIPE at its default) would reach the processes later tests start -- a child inherits an ignored
    signal, and a Ctrl-C test's run then finishes instead of stopping. Put back, and said."""
    import warnings

    saved = signal_handlers()
    saved.pop(signal.SIGALRM, None)  # pytest-timeout's, set and cleared around each test
    yield
    changed = restore_signal_handlers(saved)
    if changed:
        warnings.warn(f"this test left the handlers of signals {changed} changed; put back", stacklevel=1)


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the whole session, shared by the xdist workers, from each worker's first test on (so what a
    test finds does not hang on which ran before it): each tiny model is built, and each program compiled and
    stored, once (builds and stored executables appear whole, by rename, so a worker never reads another's
    half-written file). JAX's persistent compilation cache is pointed at it here, as a run in this process would
    point it (compilation_cache's defaults under paths.cache_dir): a program compiled again -- by a test's
    reference module beside ours, or by a test on the other worker -- is read back, not compiled. Tests of the
    cache itself use their own folders, in processes of their own."""
    from sdjax_runner.config.schema import CompilationCacheConfig
    from sdjax_runner.engine import compile_cache

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are popen-gwN/ under the session's
    path = root / "cache"
    path.mkdir(exist_ok=True)
    os.environ["SDJAX_RUNNER_CACHE_DIR"] = str(path)
    compile_cache.configure(CompilationCacheConfig(dir=str(path / "xla")))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir) -> Path:
    from sdjax_runner.models.builtin import build_builtin

    return build_builtin("tiny-random", cache_dir / "models" / "tiny-random-v2")


@pytest.fixture(scope="session")
def tiny_xl_dir(cache_dir) -> Path:
    from sdjax_runner.models.builtin import build_builtin

    return build_builtin("tiny-random-xl", cache_dir / "models" / "tiny-random-xl-v2")


@pytest.fixture(scope="session")
def basic_seed_sweep(tmp_path_factory, tiny_model_dir) -> Path:
    """``+experiment=smoke seed=0,...,7`` on 4 CPU devices by Hydra's basic launcher in one process: the images
    every other launcher's sweep must give (tests/test_ray_sweeps.py, tests/test_submitit_sweeps.py)."""
    from helpers.cli import run_cli

    work = tmp_path_factory.mktemp("basic-sweep")
    result = run_cli("-m", "+experiment=smoke", "seed=0,1,2,3,4,5,6,7", "parallelism.host_device_count=4",
                     f"hydra.sweep.dir={work / 'sweep'}", "tracking=none", cwd=work)
    assert result.returncode == 0, result.stderr
    return work / "sweep"


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty embedded MLflow store, migrated once: creating one costs ~5 s of schema migrations."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture(autouse=True)
def _seeded_store(request, mlflow_template):
    if "tmp_path" in request.fixturenames:
        seed_store(request.getfixturevalue("tmp_path"), mlflow_template)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, tiny_model_dir, mlflow_template):
    """The README's command, ``+experiment=smoke``, with outputs under a temporary directory."""
    work = tmp_path_factory.mktemp("smoke")
    seed_store(work, mlflow_template)
    run_dir = work / "outputs" / "the-run"
    result = run_cli("+experiment=smoke", f"hydra.run.dir={run_dir}", cwd=work, steady_timing=True)
    assert result.returncode == 0, result.stderr
    return work, run_dir, result
