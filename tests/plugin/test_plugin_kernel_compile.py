"""The KV-cache update kernel source compiles (nvcc, NVRTC) and exports exactly the entry points
the Python launcher asks for; launch plans and geometry. CPU only: nothing here runs a kernel."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from trt_kv.errors import ShapeError
from trt_kv.plugin import kernels
from trt_kv.plugin.kernels import KernelCompileError, kernel_name, launch_geometry, plan_launch

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
needs_nvrtc = pytest.mark.skipif(
    not kernels.nvrtc_available(),
    reason="cuda-python cannot load libnvrtc (pip install nvidia-cuda-nvrtc)",
)
# sm_87 is Jetson Orin (JetPack 6, TensorRT 10.3): the platform this fallback exists for.
ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90")
SOURCE = [str(kernels.source_path())]


def ptx_entries(ptx: str) -> set[str]:
    return set(re.findall(r"\.visible \.entry (\w+)\(", ptx))


def test_kernel_names_cover_every_dtype_index_and_form():
    names = kernels.kernel_names()
    assert len(names) == len(set(names)) == 18
    assert "trt_kv_cache_update_padded_f32_i32" in names
    assert "trt_kv_cache_update_packed_bf16_i64_i32" in names


def test_kernel_name_spells_dtype_then_index_then_lengths():
    assert kernel_name("padded", "float16", "int64") == "trt_kv_cache_update_padded_f16_i64"
    assert (
        kernel_name("packed", "bfloat16", "int32", "int64")
        == "trt_kv_cache_update_packed_bf16_i32_i64"
    )


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (("ragged", "float16", "int32"), "form"),
        (("padded", "int8", "int32"), "cache dtype"),
        (("padded", "float16", "float32"), "write_indices dtype"),
        (("padded", "float16", "int32", "int32"), "update_lengths"),
        (("packed", "float16", "int32"), "update_lengths dtype"),
    ],
)
def test_kernel_name_rejects_unknown_variants(args, word):
    with pytest.raises(ValueError, match=word):
        kernel_name(*args)


@pytest.mark.parametrize(
    ("n", "grid"),
    [(0, 1), (1, 1), (256, 1), (257, 2), (256 * 65535, 65535), (256 * 65535 + 1, 65535)],
)
def test_launch_geometry_is_256_thread_blocks_capped_at_65535(n, grid):
    assert launch_geometry(n) == ((grid, 1, 1), (256, 1, 1))


def test_plan_padded_passes_b_n_smax_h_s():
    plan = plan_launch((2, 4, 16, 8), (2, 4, 3, 8), "float16", "int32")
    assert plan.name == "trt_kv_cache_update_padded_f16_i32"
    assert plan.sizes == (2, 4, 16, 8, 3)
    assert plan.num_elements == 2 * 4 * 3 * 8
    assert plan.cache_bytes == 2 * 4 * 16 * 8 * 2
    assert plan.grid == (1, 1, 1)


def test_plan_packed_passes_b_n_smax_h_t():
    plan = plan_launch((3, 2, 10, 64), (7, 2, 64), "float32", "int64", "int32")
    assert plan.name == "trt_kv_cache_update_packed_f32_i64_i32"
    assert plan.sizes == (3, 2, 10, 64, 7)
    assert plan.num_elements == 7 * 2 * 64
    assert plan.cache_bytes == 3 * 2 * 10 * 64 * 4
    assert plan.grid == (4, 1, 1)


def test_plan_empty_update_launches_nothing():
    assert plan_launch((1, 1, 4, 2), (1, 1, 0, 2), "float32", "int32").num_elements == 0


@pytest.mark.parametrize(
    ("cache", "update", "lengths"),
    [
        ((2, 4, 16), (2, 4, 3, 8), None),  # cache rank 3
        ((2, 4, 16, 8), (2, 5, 3, 8), None),  # N differs
        ((2, 4, 16, 8), (2, 4, 3, 4), None),  # H differs
        ((2, 4, 16, 8), (7, 4, 8), None),  # packed update without lengths
        ((2, 4, 16, 8), (7, 3, 8), "int32"),  # packed N differs
    ],
)
def test_plan_rejects_mismatched_shapes(cache, update, lengths):
    with pytest.raises(ShapeError):
        plan_launch(cache, update, "float16", "int32", lengths)


def test_plan_rejects_sizes_that_do_not_fit_int32():
    with pytest.raises(ShapeError, match="2\\*\\*31"):
        plan_launch((1, 1, 2**31, 2), (1, 1, 1, 2), "float32", "int32")


def test_missing_source_names_the_env_var_and_path(monkeypatch, tmp_path):
    monkeypatch.setenv(kernels.SOURCE_ENV, str(tmp_path / "nope.cu"))
    with pytest.raises(KernelCompileError, match=r"TRT_KV_PLUGIN_SOURCE.*nope\.cu"):
        kernels.source()


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_nvcc_compiles_a_cubin_with_every_entry_point(arch, tmp_path):
    out = tmp_path / f"{arch}.cubin"
    subprocess.run(
        [NVCC, "-cubin", f"-arch={arch}", "--Werror", "all-warnings", "-o", str(out), *SOURCE],
        check=True,
        capture_output=True,
    )
    image = out.read_bytes()
    assert image[:4] == b"\x7fELF"
    missing = [n for n in kernels.kernel_names() if n.encode() not in image]
    assert missing == []


@pytest.mark.nvcc
@needs_nvcc
def test_nvcc_ptx_exports_exactly_the_launcher_names(tmp_path):
    out = tmp_path / "k.ptx"
    subprocess.run(
        [NVCC, "-ptx", "-arch=compute_80", "-o", str(out), *SOURCE],
        check=True,
        capture_output=True,
    )
    assert ptx_entries(out.read_text()) == set(kernels.kernel_names())


@needs_nvrtc
def test_nvrtc_ptx_exports_exactly_the_launcher_names():
    ptx = kernels.nvrtc_compile("compute_80").rstrip(b"\0").decode()
    assert ".target sm_80" in ptx
    assert ptx_entries(ptx) == set(kernels.kernel_names())


@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_nvrtc_compiles_a_cubin_with_every_entry_point(arch):
    image = kernels.nvrtc_compile(arch)
    assert image[:4] == b"\x7fELF"
    assert [n for n in kernels.kernel_names() if n.encode() not in image] == []


@needs_nvrtc
def test_nvrtc_compile_error_carries_the_log(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k() { undeclared_name = 1; }\n')
    monkeypatch.setenv(kernels.SOURCE_ENV, str(broken))
    with pytest.raises(KernelCompileError, match="undeclared_name"):
        kernels.nvrtc_compile("compute_80")


@needs_nvrtc
def test_arch_for_prefers_the_gpus_own_cubin():
    archs = kernels.nvrtc_archs()
    assert 80 in archs
    assert kernels.arch_for(8, 0) == "sm_80"


@needs_nvrtc
def test_arch_for_unknown_newer_gpu_falls_back_to_ptx_of_an_older_arch():
    target = kernels.arch_for(9, 9)  # no sm_99: PTX that the driver JIT-compiles
    assert target.startswith("compute_")
    assert int(target.removeprefix("compute_")) in kernels.nvrtc_archs()
    assert int(target.removeprefix("compute_")) <= 99


@needs_nvrtc
def test_arch_for_too_old_gpu_raises():
    with pytest.raises(KernelCompileError, match="compute capability"):
        kernels.arch_for(1, 0)
