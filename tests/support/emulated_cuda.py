"""Calling the CUDA runtime the way cuda-python is called, for the emulator's tests."""


def rt():
    """``cuda.bindings.runtime`` as imported now (the stand-in inside ``emulated_gpu()``)."""
    from cuda.bindings import runtime

    return runtime


def ok(result):
    """The values of a cuda-python ``(err, *values)`` result; asserts ``err`` is success."""
    err, *values = result
    assert err == rt().cudaError_t.cudaSuccess, err
    return values[0] if len(values) == 1 else tuple(values)
