"""TensorRT-RTX's runtime cache in a file: the kernels its just-in-time compiler builds for
an engine while it runs, saved so the next process loads them instead of compiling again.

TensorRT-RTX checks a loaded cache against the environment (GPU, TensorRT-RTX and driver
versions...) and refuses one that does not match, or a corrupt file: the run then starts
with an empty cache and :meth:`RuntimeCacheFile.save` replaces the file. Full TensorRT has no
runtime cache (it compiles nothing at run time), so the option is refused there.
"""

from __future__ import annotations

import os
from pathlib import Path

from trt_kv.errors import ArgumentError, EngineRunError, mismatch


def check_runtime_cache_path(path: str | Path) -> Path:
    """``path`` as a Path when it can hold TensorRT-RTX's runtime cache: the installed
    TensorRT is TensorRT-RTX, ``path`` is a file or absent, in an existing folder.

    Raises:
        ArgumentError: naming ``runtime_cache``, the expected and the actual value.
    """
    from trt_kv._trt import FEATURES

    if not isinstance(path, (str, Path)):
        raise ArgumentError(mismatch("runtime_cache", "a file path or None", "", repr(path)))
    path = Path(path)
    if not FEATURES.is_rtx:
        installed = f"{FEATURES.module} {FEATURES.version}"
        raise ArgumentError(
            mismatch("runtime_cache", "None with full TensorRT (TensorRT-RTX's)", "", installed)
        )
    if path.is_dir() or not path.parent.is_dir():
        what = "a folder" if path.is_dir() else f"{path} (no folder {path.parent})"
        raise ArgumentError(mismatch("runtime_cache", "a file in an existing folder", "", what))
    return path


class RuntimeCacheFile:
    """A runtime cache attached to ``runtime_config`` (an ``IRuntimeConfig``), loaded from
    ``path`` when the file exists and TensorRT-RTX accepts it (:attr:`loaded`). Attach it
    before the execution context is created; :meth:`save` writes it back (atomically)."""

    def __init__(self, path: Path, runtime_config: object) -> None:
        self.path = path
        self.cache = runtime_config.create_runtime_cache()
        self.loaded = self.path.is_file() and bool(self.cache.deserialize(self.path.read_bytes()))
        if not runtime_config.set_runtime_cache(self.cache):
            raise EngineRunError("set_runtime_cache: TensorRT refused (see its log)")

    def save(self) -> None:
        """Write the cache to :attr:`path` through a temporary file in the same folder (a
        reader never sees half a cache)."""
        blob = self.cache.serialize()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(memoryview(blob))
        os.replace(tmp, self.path)
