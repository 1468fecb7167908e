"""Run ``python -m trt_kv`` as a user would: a fresh interpreter on this checkout."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def user_env(**extra: str) -> dict:
    """This process's environment with the checkout first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def run_cli(*argv: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    """``python -m trt_kv ARGV...``; stdout and stderr captured as text (not a terminal)."""
    out = subprocess.run(
        [sys.executable, "-m", "trt_kv", *map(str, argv)],
        capture_output=True,
        text=True,
        env=user_env(**env),
        check=False,
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out
