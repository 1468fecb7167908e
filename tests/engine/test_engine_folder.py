"""Where engines go by default: the checkout's ``engines/``, or ``./engines`` for an
installed package (never site-packages)."""

import shutil
import subprocess
import sys
from pathlib import Path

from trt_kv.engine import ENGINES_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_builds_into_its_engines_folder():
    assert ENGINES_DIR == ROOT / "engines"


def test_an_installed_package_builds_into_the_current_directory(tmp_path):
    site = tmp_path / "site-packages"  # the package alone, as pip installs it: no pyproject
    shutil.copytree(ROOT / "trt_kv", site / "trt_kv")
    work = tmp_path / "work"
    work.mkdir()
    code = "import trt_kv.engine as d; print(d.__file__); print(d.ENGINES_DIR)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=work,
        env={"PYTHONPATH": str(site), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == [
        str(site / "trt_kv" / "engine" / "__init__.py"),
        str(work / "engines"),
    ]
