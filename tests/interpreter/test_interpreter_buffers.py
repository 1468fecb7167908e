"""Addresses of arrays as the compiled helper takes them (``buffers.address``): every address
is NumPy's own ``a.ctypes.data``, read from the array object where NumPy's struct has it."""

from __future__ import annotations

import numpy as np

from trt_kv.interpreter import buffers


def _read_only(n: int) -> np.ndarray:
    a = np.arange(n, dtype=np.float32)
    a.flags.writeable = False
    return a


class _Sub(np.ndarray):
    """An ndarray subclass: its address is taken the general way."""


def test_every_kind_of_array_gives_numpys_address():
    writeable = np.zeros((4, 6), np.float32)
    kinds = (
        writeable, writeable[:, ::2], writeable[1:], writeable[::-1], writeable.T,
        writeable[2:, 3:][::-1], _read_only(5), np.zeros(0, np.int64), np.float64(2.0) * np.ones(1),
        writeable.view(_Sub),
    )  # fmt: skip
    for a in kinds:
        assert buffers.address(a) == a.ctypes.data


def test_the_data_field_is_found_on_this_build():
    """Standard CPython and NumPy: the address is read from the array object, not through
    ``a.ctypes`` (the slow way stays for builds where the probes disagree)."""
    found = buffers._DATA
    assert found == object.__basicsize__


def test_a_new_array_at_a_freed_arrays_place_gets_its_own_address():
    for n in range(1, 200):  # ids and memory are reused as arrays come and go
        a = _read_only(n)
        assert buffers.address(a) == a.ctypes.data
        del a
