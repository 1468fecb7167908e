"""What refusing non-finite weights costs at load (target <= 10% of the load time).

    python scripts/bench_load_check.py [--model default] [--rounds 5]

Each round reads the checkpoint (``read_checkpoint``: the file read, dequantized, and every
tensor checked by ``check_finite`` as it is made), then runs ``check_finite`` again over the
arrays it produced, timed alone: that is the check's share of the load. CPU time of this
process (``time.process_time``) is steadier than wall time on a shared machine; both shown.
"""

from __future__ import annotations

import argparse
import statistics
import time

from trt_kv.checkpoints import read_checkpoint
from trt_kv.checkpoints.checkpoint import check_finite

TARGET = 0.10


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rows = []
    for _ in range(args.rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        checkpoint = read_checkpoint(args.model, progress=False)
        w1, c1 = time.perf_counter(), time.process_time()
        for name, array in checkpoint.tensors.items():
            check_finite(name, array, checkpoint.source)
        w2, c2 = time.perf_counter(), time.process_time()
        rows.append((w1 - w0, c1 - c0, w2 - w1, c2 - c1))
    values = sum(a.size for a in checkpoint.tensors.values())
    dtypes = sorted({str(a.dtype) for a in checkpoint.tensors.values()})
    print(f"{args.model}: {len(checkpoint.tensors)} tensors, {values:,} values ({dtypes})")
    print(f"{'':8} {'load s':>8} {'check s':>8} {'check/load':>11}")
    for k, clock in ((0, "wall"), (1, "cpu")):
        load = statistics.median(r[k] for r in rows)
        check = statistics.median(r[k + 2] for r in rows)
        print(f"{clock:8} {load:8.3f} {check:8.3f} {check / load:10.1%}")
    print(f"target: check/load <= {TARGET:.0%} (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
