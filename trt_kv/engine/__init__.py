"""The engine stage: a built engine on disk, and where engines come from.

Four parts, at three layers of trt_kv (imports go down, never up):

- the **store**, :mod:`trt_kv.engine.store`: engine file names, the reuse rule and builds
  (network -> engine bytes -> engine file with sidecar). It builds the models' networks, so
  it sits above :mod:`trt_kv.models`; the CLI and scripts call it.
- the **recipes**, :mod:`trt_kv.engine.recipes`: the network a sidecar's recipe names, built
  again (what the emulated GPU runs for an engine built in another process). Over the store.
- the **weights digest**, :mod:`trt_kv.engine.digest`: the sha256 of a model's weights that
  the store compares and the sidecar records, cached by checkpoint file. Above the models
  too: it reads weights through their architecture.
- the **file format**, :mod:`trt_kv.engine.file` (``NAME.engine`` beside its JSON sidecar,
  written atomically, checked when read) over :mod:`trt_kv.engine.sidecar` (what the
  sidecar holds, every field checked). Below the runtime and the emulator, which read
  sidecars; it imports the builder, never the models or the store.

This module holds only :data:`ENGINES_DIR`, where engines and their sidecars go by default
(``--out``, the store's ``out_dir``). Run from a checkout (the repository's
``pyproject.toml`` beside the package, as with ``pip install -e .``): its ``engines/``
folder, the project layout. Installed as a package: ``engines/`` in the current directory,
never inside site-packages (often read-only, and wiped by the next ``pip install``). It
imports nothing heavy and none of the parts: ``trt-kv --help`` reads it, and every
import of the file format runs it.
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
