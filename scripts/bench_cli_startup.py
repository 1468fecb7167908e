"""``trt-kv --help`` start-up time (target <= 60 ms), beside bare Python's for scale.

    python scripts/bench_cli_startup.py [--runs 20]

Each command runs in a fresh interpreter with this checkout on PYTHONPATH; the table gives
the median and the fastest run in ms. TensorRT, NumPy and the runtime are imported only by
the subcommand that needs them, so ``--help`` pays for argparse and trt_kv.cli alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 60.0
ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -m trt_kv --help": [sys.executable, "-m", "trt_kv", "--help"],
}


def run_ms(cmd: list[str], runs: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    bare, cli = (run_ms(cmd, args.runs) for cmd in COMMANDS.values())
    print(f"{'command':<26} {'median ms':>10} {'best ms':>8}")
    for name, ms in zip(COMMANDS, (bare, cli)):
        print(f"{name:<26} {statistics.median(ms):>10.1f} {min(ms):>8.1f}")
    median = statistics.median(cli)
    verdict = "ok" if median <= TARGET_MS else "MISSED"
    print(
        f"\ntrt-kv --help: {median:.1f} ms median (target <= {TARGET_MS:.0f} ms: {verdict}); "
        f"trt_kv's own share over bare Python: {median - statistics.median(bare):.1f} ms"
    )


if __name__ == "__main__":
    main()
