"""Engine file -> deserialized ICudaEngine, alias pairs checked (GPU only)."""

from __future__ import annotations

from pathlib import Path

from trt_kv import engine_file
from trt_kv._trt import logger, trt
from trt_kv.engine_file import EngineMeta, check_engine_aliases
from trt_kv.errors import EngineFileError, mismatch
from trt_kv.runtime.cuda import require_gpu


def load_cuda_engine(path: str | Path) -> tuple[object, bytes, EngineMeta]:
    """Read, verify and deserialize an engine; check ``get_aliased_input_tensor`` against
    the sidecar. Returns ``(engine, engine bytes, sidecar)``."""
    require_gpu(f"loading {path}")
    data, meta = engine_file.load_engine_file(path)  # by attribute: the emulator records it
    if meta.cache_update == "plugin":
        from trt_kv.plugin import register_creator

        register_creator()
    engine = trt.Runtime(logger()).deserialize_cuda_engine(data)
    if engine is None:
        raise EngineFileError(
            mismatch(
                str(path),
                "an engine this GPU can deserialize",
                "ICudaEngine",
                "None (see the TensorRT log)",
            )
        )
    check_engine_aliases(engine, meta)
    return engine, data, meta
