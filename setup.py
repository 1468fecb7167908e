"""The one compiled part of trt_kv: float16 conversions for the CPU interpreter.

Optional: without a C compiler (or where it fails) the install goes on and the interpreter
keeps its NumPy recipes (trt_kv/interpreter/half.py), with the same results, slower.
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "trt_kv.interpreter._float16",
            ["trt_kv/interpreter/_float16.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
