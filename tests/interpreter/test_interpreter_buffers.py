"""Addresses of arrays as the compiled helper takes them (``buffers.address``): a read-only
array's is remembered while it lives and forgotten with it; every address is NumPy's own
``a.ctypes.data``."""

from __future__ import annotations

import gc

import numpy as np

from trt_kv.interpreter import buffers


def _read_only(n: int) -> np.ndarray:
    a = np.arange(n, dtype=np.float32)
    a.flags.writeable = False
    return a


def test_every_kind_of_array_gives_numpys_address():
    writeable = np.zeros((4, 6), np.float32)
    for a in (writeable, writeable[:, ::2], _read_only(5), writeable[1:]):
        assert buffers.address(a) == a.ctypes.data


def test_a_read_only_arrays_address_is_kept_while_it_lives_and_no_longer():
    a = _read_only(8)
    assert buffers.address(a) == buffers.address(a) == a.ctypes.data
    key = id(a)
    assert key in buffers._HELD
    del a
    gc.collect()
    assert key not in buffers._HELD


def test_a_new_array_at_a_freed_arrays_place_gets_its_own_address():
    held = len(buffers._HELD)  # other tests' plans may still hold theirs
    for n in range(1, 200):  # ids are reused as arrays come and go
        a = _read_only(n)
        assert buffers.address(a) == a.ctypes.data
        del a
    assert len(buffers._HELD) - held < 10  # entries left with their arrays
