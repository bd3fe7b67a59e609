"""Running ``python -m sdjax_runner`` as a user does, and what its errors must look like."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def run_cli(*overrides: str, cwd: Path, env: dict | None = None, timeout: int = 300,
            command: str | None = None) -> subprocess.CompletedProcess:
    """``python -m sdjax_runner [COMMAND] OVERRIDES`` in a subprocess, as a user runs it (COMMAND: runs,
    rerun, sync, resume; none: a run or sweep)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "sdjax_runner", *([command] if command else []), *overrides], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 2, no traceback, one line on stderr starting with ``expected``."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(expected), errors[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
