"""The GPU probe says in words why no device is usable: cudaGetDeviceCount's error read with
the driver's version (``cudaErrorInsufficientDriver`` both without a driver and with an old
one)."""

import pytest
from cuda.bindings import runtime as rt

from tests.support.cli_user import run_cli
from trt_kv.runtime.gpu.cuda import count_failure

NO_DRIVER = rt.cudaDriverGetVersion()[1] == 0  # no libcuda loaded: this machine
RUNTIME = rt.cudaRuntimeGetVersion()[1]


def test_insufficient_driver_without_a_driver_is_no_nvidia_driver_found():
    err = rt.cudaError_t.cudaErrorInsufficientDriver
    assert count_failure(err, 0, 13040) == "no NVIDIA driver found"


def test_insufficient_driver_with_an_old_driver_names_both_versions():
    err = rt.cudaError_t.cudaErrorInsufficientDriver
    assert count_failure(err, 12020, 13040) == (
        "the NVIDIA driver (CUDA 12.2) is older than the CUDA runtime (13.4) needs"
    )


def test_no_device_is_no_cuda_device():
    assert count_failure(rt.cudaError_t.cudaErrorNoDevice, 13040, 13040) == "no CUDA device"


@pytest.mark.skipif(not NO_DRIVER, reason="this machine has an NVIDIA driver")
def test_version_without_a_driver_says_no_nvidia_driver_found():
    lines = run_cli("--version").stdout.splitlines()
    runtime = f"{RUNTIME // 1000}.{RUNTIME % 1000 // 10}"
    assert lines[4] == (
        f"CUDA: runtime {runtime}, no driver; no usable device: no NVIDIA driver found"
    )
