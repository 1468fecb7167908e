"""TensorRT-RTX's runtime cache file behind ``TrtBackend(runtime_cache=...)`` and
``generate --runtime-cache``: created at close, loaded by the next backend, a corrupt file
ignored and replaced, bad paths refused before anything is loaded.

On a machine without a GPU these run on the emulated device, whose cache holds one entry per
engine instead of compiled kernels: what is checked is trt_kv's handling of the cache (made,
attached before the context, loaded when valid, saved atomically), not TensorRT-RTX's
compiler (results "emulated")."""

import hashlib
import json

import pytest

from tests.conftest import REAL_GPU_REASON
from tests.runtime.gpu.test_gpu_runtime import PROMPTS, reference_ids
from tests.runtime.gpu.test_gpu_runtime import engine_path as engine_path  # the fixture
from tests.support.cli_user import write_tiny_model
from trt_kv import FEATURES
from trt_kv.cli import main
from trt_kv.errors import ArgumentError
from trt_kv.runtime import Session, generate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not FEATURES.is_rtx, reason="the runtime cache is TensorRT-RTX's"),
]


def _run(engine_path, cache):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = TrtBackend(engine_path, runtime_cache=cache)
    try:
        ids = generate(Session(backend), PROMPTS, 8).ids
        return ids, backend.runtime_cache.loaded
    finally:
        backend.close()


def test_cache_is_saved_at_close_and_loaded_by_the_next_backend(engine_path, tmp_path):
    cache = tmp_path / "kernels.rtxcache"
    assert _run(engine_path, cache) == (reference_ids(), False)  # no file yet
    first = cache.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, no temporary left
    if REAL_GPU_REASON is not None:  # emulated: the entry of this engine's kernels, made
        # when the context was created with the cache attached (attached later: no entry)
        engine_sha = hashlib.sha256(engine_path.read_bytes()).hexdigest()
        assert first.endswith(b"\n" + engine_sha.encode()), first
    assert _run(engine_path, cache) == (reference_ids(), True)
    assert cache.read_bytes() == first  # the same engine's kernels: nothing new


def test_corrupt_cache_is_ignored_and_replaced(engine_path, tmp_path):
    cache = tmp_path / "kernels.rtxcache"
    cache.write_bytes(b"not a runtime cache")
    assert _run(engine_path, cache) == (reference_ids(), False)
    assert _run(engine_path, cache)[1] is True  # the file written at close is valid


def test_cache_path_in_no_folder_or_a_folder_is_refused_before_loading(engine_path, tmp_path):
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    missing = tmp_path / "nope" / "k.rtxcache"
    with pytest.raises(ArgumentError) as err:
        TrtBackend(engine_path, runtime_cache=missing)
    assert str(err.value) == (
        f"runtime_cache: expected a file in an existing folder, got {missing} "
        f"(no folder {missing.parent})"
    )
    with pytest.raises(ArgumentError, match=r"^runtime_cache: expected a file in an existing "):
        TrtBackend(engine_path, runtime_cache=tmp_path)
    with pytest.raises(
        ArgumentError, match=r"^runtime_cache: expected a file path or None, got 3$"
    ):
        TrtBackend(engine_path, runtime_cache=3)


def test_generate_runtime_cache_option_writes_the_file(tmp_path, capsys):
    cache = tmp_path / "k.rtxcache"
    ask = ["generate", "--model", str(write_tiny_model(tmp_path / "m")), "--json", "-q"]
    ask += ["--prompt-ids", "5,17,42", "--max-new-tokens", "4", "--max-seq-len", "16"]
    ask += ["--max-batch", "1", "--dtype", "float32", "--out", str(tmp_path / "e")]
    runs = []
    for backend in (["reference"], ["tensorrt", "--runtime-cache", str(cache)]):
        assert main([*ask, "--backend", *backend]) == 0
        runs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ids"])
    assert runs[0] == runs[1] and cache.is_file()
