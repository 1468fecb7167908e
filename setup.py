"""The one compiled part of trt_kv: float16 conversions for the CPU interpreter.

Optional: without a C compiler (or where it fails) the install goes on and the interpreter
keeps its NumPy recipes (trt_kv/interpreter/half.py), with the same results, slower.
Everything else about the package is in pyproject.toml.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "trt_kv/interpreter/_native.c"
# Compiled into the library: the loader takes a build of this very source only
DIGEST = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "trt_kv.interpreter._native",
            [SOURCE],
            define_macros=[("TRT_KV_NATIVE_SOURCE", f'"{DIGEST}"')],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
