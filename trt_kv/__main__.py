"""``python -m trt_kv``: the ``trt-kv`` command."""

import sys

from trt_kv.cli import main

sys.exit(main())
