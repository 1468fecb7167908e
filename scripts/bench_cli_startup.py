"""``trt-kv --help`` start-up time (target <= 60 ms), beside bare Python's for scale.

    python scripts/bench_cli_startup.py [--runs 20]

Each command runs in a fresh interpreter with this checkout on PYTHONPATH. Wall time is what
a user waits; CPU time (user + sys of the child) is steadier on a shared machine. TensorRT,
NumPy and the runtime are imported only by the subcommand that needs them, so ``--help``
pays for argparse and trt_kv.cli alone (``python -X importtime -m trt_kv --help`` shows it).
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


def run_ms(cmd: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of ``runs`` runs of ``cmd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    wall, cpu = [], []
    for _ in range(runs):
        start = time.perf_counter()
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((usage.ru_utime + usage.ru_stime) * 1e3)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {child.returncode}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    results = {name: run_ms(cmd, args.runs) for name, cmd in COMMANDS.items()}
    print(f"{'command':<26} {'wall median':>12} {'wall best':>10} {'CPU median':>11}")
    for name, (wall, cpu) in results.items():
        print(
            f"{name:<26} {statistics.median(wall):>9.1f} ms {min(wall):>7.1f} ms "
            f"{statistics.median(cpu):>8.1f} ms"
        )
    (bare_wall, bare_cpu), (wall, cpu) = results.values()
    median = statistics.median(wall)
    verdict = "ok" if median <= TARGET_MS else "MISSED"
    print(
        f"\ntrt-kv --help: {median:.1f} ms wall median (target <= {TARGET_MS:.0f} ms: "
        f"{verdict}); trt_kv's own share over bare Python: "
        f"{median - statistics.median(bare_wall):.1f} ms wall, "
        f"{statistics.median(cpu) - statistics.median(bare_cpu):.1f} ms CPU"
    )


if __name__ == "__main__":
    main()
