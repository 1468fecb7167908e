"""The identity of a model's weights: the sha256 of every array as loaded (dtype, shape,
bytes, in a fixed order), which engine reuse compares and the sidecar records.

Hashing SmolLM2-135M's 538 MB of float32 arrays takes 0.3-0.9 s on a 2-core machine
(``scripts/bench_reuse.py``), so :func:`weights_sha256` caches the digest of weights read
from files in ``$TRT_KV_CACHE/weights-sha256.json`` (default ``~/.cache/trt_kv``), keyed by
each checkpoint file's resolved path, size, ``st_mtime_ns``, inode and ``st_ctime_ns`` and
by the sha256 of trt_kv's own checkpoint readers and weight mapping (a change there can
change the arrays). Weights without files (seeded random ones) are hashed every time. A
file rewritten with the same size and its modification time set back still changes its
ctime (which no user tool sets back), so it is hashed anew; copying the checkpoint
elsewhere (a new path) does too.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

import numpy as np

CACHE_FILE = "weights-sha256.json"
CACHE_ENTRIES = 256  # the most recent kept
PACKAGE = Path(__file__).resolve().parent.parent
# the modules that decide the arrays of a checkpoint (readers, weight mappings)
READERS = ("checkpoints/*.py", "models/*.py", "models/*/*.py")


def weights_digest(weights: object) -> str:
    """sha256 over every weight array's dtype, shape and bytes, in a fixed order (the
    architecture's :meth:`weight_arrays`)."""
    from trt_kv.models.architectures import architecture_of

    digest = hashlib.sha256()
    for a in architecture_of(weights).weight_arrays(weights):
        if a is not None:
            a = np.ascontiguousarray(a)
            digest.update(f"{a.dtype.str}{a.shape}".encode())
            digest.update(a.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def source_files(spec: str | Path) -> list[Path]:
    """The files ``load_model(spec)`` reads weights from: the default model's GGUF (when it
    is in the cache), a ``.gguf`` file, or every file of a checkpoint folder; ``[]`` when
    none exists (the default model's random fallback)."""
    if str(spec) == "default":
        from trt_kv.checkpoints.default import GGUF_MEMBER, cache_dir

        path = cache_dir() / Path(GGUF_MEMBER).name
        return [path] if path.is_file() else []
    path = Path(spec)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path] if path.is_file() else []


def _identity(stat: os.stat_result) -> tuple[int, ...]:
    """What says a file is unchanged: size, modification time, inode and status-change
    time (``st_ctime_ns``: set by the kernel on every write, rename or ``utime``, and by no
    user tool back, so a same-size rewrite with its mtime restored still changes it)."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns


@cache
def _readers_sha256() -> str:
    digest = hashlib.sha256()
    for pattern in READERS:
        for path in sorted(PACKAGE.glob(pattern)):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _key(files: list[Path]) -> str:
    stats = [(str(p.resolve()), *_identity(p.stat())) for p in files]
    text = json.dumps([_readers_sha256(), stats])
    return hashlib.sha256(text.encode()).hexdigest()


def weights_sha256(spec: str | Path, weights: object) -> str:
    """:func:`weights_digest` of ``weights``, loaded by ``load_model(spec)``: from the cache
    when its files are unchanged, else hashed (and cached; a cache that cannot be read or
    written is passed over).

    Raises:
        ArgumentError: ``$TRT_KV_CACHE`` names a file (or a path under one).
    """
    from trt_kv.checkpoints.default import cache_dir, check_cache_dir

    files = source_files(spec)
    if not files:
        return weights_digest(weights)
    check_cache_dir(cache_dir())
    store = cache_dir() / CACHE_FILE
    try:
        key = _key(files)
        known = json.loads(store.read_text()) if store.is_file() else {}
    except (OSError, ValueError):
        return weights_digest(weights)
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    digest = weights_digest(weights)
    known = {**(known if isinstance(known, dict) else {}), key: digest}
    known = dict(list(known.items())[-CACHE_ENTRIES:])
    temp = store.with_name(f".{store.name}.{os.getpid()}.tmp")
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(json.dumps(known))
        os.replace(temp, store)
    except OSError:
        temp.unlink(missing_ok=True)
    return digest
