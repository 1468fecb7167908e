"""Where engines and their sidecars go by default (``--out``, ``trt_kv.engine.store``).

Run from a checkout (the repository's ``pyproject.toml`` beside the package, as with
``pip install -e .``): its ``engines/`` folder, the project layout. Installed as a package:
``engines/`` in the current directory, never inside site-packages (often read-only, and
wiped by the next ``pip install``). Imports nothing heavy: ``trt-kv --help`` reads it.
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent.parent


def default_engines_dir() -> Path:
    """``<checkout>/engines`` when trt_kv runs from a checkout, else ``./engines``."""
    if (CHECKOUT / "pyproject.toml").is_file():
        return CHECKOUT / "engines"
    return Path.cwd() / "engines"


ENGINES_DIR = default_engines_dir()
