"""The KV-cache update kernels: source, entry-point names, launch plans and NVRTC compiles.

The CUDA source is ``plugins/kv_cache_update.cu`` (its header comment is the kernel contract).
Nothing here touches a GPU: a :class:`KernelLaunch` is plain data, and NVRTC is a compiler
library that runs on the CPU (``pip install nvidia-cuda-nvrtc`` for ``libnvrtc.so``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from trt_kv.errors import ShapeError, TrtKvError, mismatch

SOURCE_ENV = "TRT_KV_PLUGIN_SOURCE"
SOURCE_NAME = "kv_cache_update.cu"
FORMS = ("padded", "packed")
DTYPE_TAGS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
INDEX_TAGS = {"int32": "i32", "int64": "i64"}
BLOCK = 256
MAX_GRID = 65535
PREFIX = "trt_kv_cache_update"


class KernelCompileError(TrtKvError, RuntimeError):
    """The kernel source is missing, NVRTC is missing, or NVRTC rejected the source."""


def source_path() -> Path:
    """``$TRT_KV_PLUGIN_SOURCE``, else ``plugins/kv_cache_update.cu`` of the source checkout."""
    forced = os.environ.get(SOURCE_ENV)
    path = Path(forced) if forced else Path(__file__).resolve().parents[2] / "plugins" / SOURCE_NAME
    if not path.is_file():
        raise KernelCompileError(
            mismatch(SOURCE_ENV, "the kernel source file", SOURCE_NAME, f"nothing at {path}")
        )
    return path


def source() -> str:
    """The CUDA source text."""
    return source_path().read_text()


def kernel_name(form: str, dtype: str, index_dtype: str, lengths_dtype: str | None = None) -> str:
    """Entry point for one variant, e.g. ``trt_kv_cache_update_packed_f16_i32_i64``.

    Raises:
        ValueError: unknown form, cache dtype or index dtype, or lengths dtype given for the
            padded form (or missing for the packed form).
    """
    if form not in FORMS:
        raise ValueError(mismatch("form", "one of", FORMS, form))
    if dtype not in DTYPE_TAGS:
        raise ValueError(mismatch("cache dtype", "one of", tuple(DTYPE_TAGS), dtype))
    if index_dtype not in INDEX_TAGS:
        raise ValueError(mismatch("write_indices dtype", "one of", tuple(INDEX_TAGS), index_dtype))
    name = f"{PREFIX}_{form}_{DTYPE_TAGS[dtype]}_{INDEX_TAGS[index_dtype]}"
    if form == "padded":
        if lengths_dtype is not None:
            raise ValueError(mismatch("update_lengths", "no lengths for", "padded", lengths_dtype))
        return name
    if lengths_dtype not in INDEX_TAGS:
        raise ValueError(
            mismatch("update_lengths dtype", "one of", tuple(INDEX_TAGS), lengths_dtype)
        )
    return f"{name}_{INDEX_TAGS[lengths_dtype]}"


def kernel_names() -> list[str]:
    """Every entry point the source must export (18: 3 dtypes x (2 padded + 4 packed))."""
    names = []
    for dtype in DTYPE_TAGS:
        for index in INDEX_TAGS:
            names.append(kernel_name("padded", dtype, index))
            names.extend(kernel_name("packed", dtype, index, lengths) for lengths in INDEX_TAGS)
    return names


def launch_geometry(num_elements: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(grid, block)`` for ``num_elements`` update elements (see the source's header)."""
    blocks = min(max(1, -(-num_elements // BLOCK)), MAX_GRID)
    return (blocks, 1, 1), (BLOCK, 1, 1)


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel call minus its pointers: the entry point, geometry and int32 size arguments.

    ``sizes`` follow the pointer arguments: ``(B, N, S_max, H, S)`` padded,
    ``(B, N, S_max, H, T)`` packed. ``num_elements`` == 0 means: launch nothing.
    """

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    sizes: tuple[int, ...]
    num_elements: int
    cache_bytes: int


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def plan_launch(
    cache_shape: tuple[int, ...],
    update_shape: tuple[int, ...],
    dtype: str,
    index_dtype: str,
    lengths_dtype: str | None = None,
) -> KernelLaunch:
    """The launch for concrete shapes: cache ``[B, N, S_max, H]``; update ``[B, N, S, H]``
    (padded, ``lengths_dtype`` None) or ``[T, N, H]`` (packed).

    Raises:
        ShapeError: ranks or B/N/H disagree between cache and update; a size >= 2**31.
    """
    form = "padded" if lengths_dtype is None else "packed"
    name = kernel_name(form, dtype, index_dtype, lengths_dtype)
    if len(cache_shape) != 4:
        raise ShapeError(mismatch("cache", "rank ([B, N, S_max, H])", 4, len(cache_shape)))
    b, n, s_max, h = (int(d) for d in cache_shape)
    expected_rank = 4 if form == "padded" else 3
    if len(update_shape) != expected_rank:
        raise ShapeError(
            mismatch("update", f"rank of the {form} form", expected_rank, update_shape)
        )
    if form == "padded":
        _, _, s, _ = (int(d) for d in update_shape)
        if tuple(update_shape) != (b, n, s, h):
            raise ShapeError(mismatch("update", "shape", (b, n, "S", h), tuple(update_shape)))
        sizes, count = (b, n, s_max, h, s), b * n * s * h
    else:
        t = int(update_shape[0])
        if tuple(update_shape) != (t, n, h):
            raise ShapeError(mismatch("update", "shape", ("T", n, h), tuple(update_shape)))
        sizes, count = (b, n, s_max, h, t), t * n * h
    if max(sizes) >= 2**31:
        raise ShapeError(
            mismatch("cache update", "sizes below 2**31 (int32 kernel args)", "", sizes)
        )
    grid, block = launch_geometry(count)
    return KernelLaunch(name, grid, block, sizes, count, b * n * s_max * h * _ITEMSIZE[dtype])


def _nvrtc() -> object:
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as e:  # ImportError, or cuda.pathfinder's DynamicLibNotFoundError
        raise KernelCompileError(
            mismatch("NVRTC", "libnvrtc (pip install nvidia-cuda-nvrtc)", "loadable", repr(e))
        ) from e
    return nvrtc


def nvrtc_available() -> bool:
    """True when cuda-python can load libnvrtc."""
    try:
        _nvrtc()
    except KernelCompileError:
        return False
    return True


def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the loaded NVRTC."""
    _, major, minor = _nvrtc().nvrtcVersion()
    return major, minor


def nvrtc_archs() -> list[int]:
    """The real architectures NVRTC can emit a cubin for, e.g. ``[75, 80, 86, ...]``."""
    _, archs = _nvrtc().nvrtcGetSupportedArchs()
    return list(archs)


def _check(nvrtc: object, result: tuple, what: str, log: str = "") -> tuple:
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result[0])
        raise KernelCompileError(mismatch(what, "NVRTC_SUCCESS", "", f"{text.decode()}\n{log}"))
    return result[1:]


def nvrtc_compile(arch: str) -> bytes:
    """Compile the source with NVRTC for ``arch``: ``"compute_XY"`` gives PTX (JIT-compiled by
    the driver at load), ``"sm_XY"`` gives a cubin for exactly that GPU. Cached per source
    text and arch.

    Raises:
        KernelCompileError: no NVRTC, or the compile failed (the message holds NVRTC's log).
    """
    return _compile(source(), arch)


@functools.cache
def _compile(text: str, arch: str) -> bytes:
    nvrtc = _nvrtc()
    (prog,) = _check(
        nvrtc,
        nvrtc.nvrtcCreateProgram(text.encode(), SOURCE_NAME.encode(), 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"--std=c++11"]
        compiled = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        if compiled[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            (size,) = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "log size")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            _check(nvrtc, compiled, f"nvrtcCompileProgram({arch})", log.decode(errors="replace"))
        ptx = arch.startswith("compute_")
        get_size = nvrtc.nvrtcGetPTXSize if ptx else nvrtc.nvrtcGetCUBINSize
        get = nvrtc.nvrtcGetPTX if ptx else nvrtc.nvrtcGetCUBIN
        (size,) = _check(nvrtc, get_size(prog), f"image size for {arch}")
        image = b" " * size
        _check(nvrtc, get(prog, image), f"image for {arch}")
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def arch_for(major: int, minor: int) -> str:
    """Best NVRTC target for a GPU of compute capability ``major.minor``: its own cubin when
    NVRTC knows it, else PTX for the newest architecture NVRTC has that the GPU can run."""
    cc = 10 * major + minor
    archs = nvrtc_archs()
    if cc in archs:
        return f"sm_{cc}"
    older = [a for a in archs if a <= cc]
    if not older:
        raise KernelCompileError(mismatch("GPU", "a compute capability NVRTC supports", archs, cc))
    return f"compute_{max(older)}"
