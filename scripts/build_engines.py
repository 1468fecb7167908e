"""Build the built-in engines into engines/ and print a summary (same as ``trt-kv build``)."""

import sys

from trt_kv.cli import main

if __name__ == "__main__":
    sys.exit(main(["build", *sys.argv[1:]]))
