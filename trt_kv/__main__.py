"""``python -m trt_kv``: the ``trt-kv`` command."""

from trt_kv.cli import program

program()
