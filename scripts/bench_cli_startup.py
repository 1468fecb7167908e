"""``trt-kv --help`` start-up time (target <= 60 ms), beside bare Python's for scale.

    python scripts/bench_cli_startup.py [--runs 20]

Each command runs in a fresh interpreter with this checkout on PYTHONPATH. Wall time is what
a user waits; CPU time (user + sys of the child) is steadier on a shared machine.

Rows:
- ``python -c pass``: the floor (interpreter start and ``site``, with every ``.pth`` file of
  this environment, the editable install's finder included);
- ``trt-kv --help``: the console script pip installed (``sysconfig`` scripts folder), with
  trt_kv's bytecode cached as an installed package has it (in a temporary
  ``PYTHONPYCACHEPREFIX``, warmed by one untimed round; nothing is written to the checkout).
  The target applies to this row;
- ``python -m trt_kv --help``: the same through ``runpy``;
- ``... no bytecode cache``: every trt_kv module compiled from source on each run, as under
  ``PYTHONDONTWRITEBYTECODE=1`` (this machine's environment sets it);
- ``trt-kv on PATH``: when ``trt-kv`` on PATH is not the script itself (a pyenv shim, say),
  what that wrapper adds.

TensorRT, NumPy and the subcommand modules are imported only by the subcommand that runs, and
``--help`` prints argparse's text stored in ``trt_kv.cli.HELP``, so it pays for ``trt_kv``
(``_trt``, ``errors``) and ``trt_kv.cli`` alone, no argparse (``python -X importtime -m
trt_kv --help`` shows it). The floor is this environment's, not trt_kv's: the table's "ours"
columns (a row minus ``python -c pass``, wall and CPU) are what trt_kv itself costs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

TARGET_MS = 60.0
TARGET_ROW = "trt-kv --help"
ROOT = Path(__file__).resolve().parent.parent


def commands(pycache: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Row name -> (argv, environment changes)."""
    cached = {"PYTHONPYCACHEPREFIX": pycache, "PYTHONDONTWRITEBYTECODE": ""}
    script = str(Path(sysconfig.get_path("scripts")) / "trt-kv")
    rows = {
        "python -c pass": ([sys.executable, "-c", "pass"], cached),
        TARGET_ROW: ([script, "--help"], cached),
        "python -m trt_kv --help": ([sys.executable, "-m", "trt_kv", "--help"], cached),
        "... no bytecode cache": (
            [sys.executable, "-m", "trt_kv", "--help"],
            {"PYTHONDONTWRITEBYTECODE": "1"},
        ),
    }
    on_path = shutil.which("trt-kv")
    if on_path and Path(on_path).resolve() != Path(script).resolve():
        rows[f"trt-kv on PATH ({on_path})"] = (["trt-kv", "--help"], cached)
    return rows


def run_once(cmd: list[str], changes: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one run of ``cmd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **changes}
    env = {k: v for k, v in env.items() if v != ""}
    start = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = (time.perf_counter() - start) * 1e3
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {os.waitstatus_to_exitcode(status)}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1e3


def run_rows(rows: dict, runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Row -> (wall ms, CPU ms) of ``runs`` runs, the rows taking turns (a shared machine's
    load then weighs on every row alike), after one untimed round (fills the bytecode
    cache)."""
    out = {name: ([], []) for name in rows}
    for k in range(runs + 1):
        for name, (cmd, changes) in rows.items():
            wall, cpu = run_once(cmd, changes)
            if k:
                out[name][0].append(wall)
                out[name][1].append(cpu)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trt_kv_pycache_") as pycache:
        rows = commands(pycache)
        results = run_rows(rows, args.runs)
    bare_wall, bare_cpu = (statistics.median(x) for x in results["python -c pass"])
    head = ("command", "wall median", "wall best", "CPU median", "ours, wall", "ours, CPU")
    print(f"{head[0]:<34} {head[1]:>12} {head[2]:>10} {head[3]:>11} {head[4]:>11} {head[5]:>10}")
    for name, (wall, cpu) in results.items():
        median, cpu_median = statistics.median(wall), statistics.median(cpu)
        print(
            f"{name:<34} {median:>9.1f} ms {min(wall):>7.1f} ms {cpu_median:>8.1f} ms "
            f"{median - bare_wall:>8.1f} ms {cpu_median - bare_cpu:>7.1f} ms"
        )
    wall, cpu = results[TARGET_ROW]
    median = statistics.median(wall)
    verdict = "ok" if median <= TARGET_MS else "MISSED"
    print(
        f"\n{TARGET_ROW}: {median:.1f} ms wall median (target <= {TARGET_MS:.0f} ms: "
        f"{verdict}); trt_kv's own share over bare Python ({bare_wall:.1f} ms): "
        f"{median - bare_wall:.1f} ms wall, {statistics.median(cpu) - bare_cpu:.1f} ms CPU"
    )


if __name__ == "__main__":
    main()
