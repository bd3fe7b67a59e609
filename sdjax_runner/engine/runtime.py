"""The process a job runs in: XLA's devices and flags (set before JAX starts), and library noise kept off
the console.

XLA reads ``XLA_FLAGS`` once, when JAX creates its backends; settings that arrive later (a later
job of a multirun) are reported and ignored. diffusers 0.39 and transformers 4.57 log a Flax
deprecation notice for every Flax class they create and a safety-checker notice per load; JAX and
absl add their own. The runner prints one line per phase instead.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import Optional

from sdjax_runner import internals
from sdjax_runner.config import checks
from sdjax_runner.config.schema import ParallelismConfig, PerformanceConfig

log = logging.getLogger("sdjax_runner")


def jax_started() -> bool:
    """Whether JAX has created its backends (after which XLA_FLAGS are not read again)."""
    if "jax" not in sys.modules:
        return False
    return internals.jax_backends_started()


def use_host_devices(count: Optional[int]) -> None:
    """Split the CPU into ``count`` XLA devices; only possible before JAX initialises."""
    if not count:
        return
    checks.host_device_count(count)
    if jax_started():
        import jax

        if jax.local_device_count("cpu") != count:
            log.warning("parallelism.host_device_count=%d ignored: JAX is already running with %d CPU devices",
                        count, jax.local_device_count("cpu"))
        return
    given = os.environ.get("XLA_FLAGS", "")
    counts = re.findall(r"--xla_force_host_platform_device_count=(\S+)", given)
    if counts and counts[-1] == str(count):
        return  # already so: the flags left as given
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", given)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def use_xla_settings(performance: PerformanceConfig) -> None:
    """performance.* flags and GPU memory share, into the environment JAX reads when it starts."""
    checks.xla_settings(performance)
    flags = [str(flag) for flag in performance.xla_flags]
    if performance.gpu_autotune_level is not None:
        flags.append(f"--xla_gpu_autotune_level={performance.gpu_autotune_level}")
    if not flags and performance.gpu_memory_fraction is None:
        return
    if jax_started():
        log.warning("performance.xla_flags/gpu_* ignored: JAX's backend already started in this process "
                    "(in a multirun the first job's settings hold)")
        return
    if flags:
        combined = " ".join([os.environ.get("XLA_FLAGS", "")] + flags).strip()
        checks.xla_flags(combined)
        os.environ["XLA_FLAGS"] = combined
    if performance.gpu_memory_fraction is not None:
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(performance.gpu_memory_fraction)


def prepare_process(parallelism: ParallelismConfig, performance: PerformanceConfig) -> None:
    """Everything about the process that must be settled before JAX starts, then multi-host setup."""
    from sdjax_runner.engine import distributed

    use_host_devices(parallelism.host_device_count)
    use_xla_settings(performance)
    distributed.initialize(parallelism)


def available_devices(mode: str) -> int:
    """Devices a job may use: every process's under the sharded path, this process's under pmap."""
    import jax

    return jax.device_count() if mode == "sharded" else jax.local_device_count()


def silence_libraries() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # diffusers and transformers are no dependencies of the runner (the built-in models' writer and the tests'
    # references import them): their verbosity is what they read as they are imported, and set where they were.
    for library in ("diffusers", "transformers"):
        os.environ.setdefault(f"{library.upper()}_VERBOSITY", "error")
        if f"{library}.utils.logging" in sys.modules:
            sys.modules[f"{library}.utils.logging"].set_verbosity_error()
            sys.modules[f"{library}.utils.logging"].disable_progress_bar()
    for name in ("absl", internals.JAX_BACKEND_LOGGER, "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for module in ("diffusers", "transformers", "flax", "jax", "qwix"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
