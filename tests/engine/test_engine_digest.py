"""The weights' sha256, cached by file path, size and modification time: a reuse does not
hash 538 MB again, and weights saved anew are hashed anew."""

import json
import os

from tests.support.cli_user import write_tiny_model
from trt_kv.engine.digest import CACHE_FILE, source_files, weights_digest, weights_sha256
from trt_kv.models.loading import load_model


def test_the_digest_is_cached_by_path_size_and_mtime_and_redone_when_they_change(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TRT_KV_CACHE", str(tmp_path / "cache"))
    folder = write_tiny_model(tmp_path / "tiny")
    weights = load_model(folder, progress=False).weights
    real = weights_digest(weights)
    assert weights_sha256(folder, weights) == real  # hashed, then stored
    store = tmp_path / "cache" / CACHE_FILE
    (key,) = json.loads(store.read_text())
    store.write_text(json.dumps({key: "c" * 64}))  # what the cache says is what is used
    assert weights_sha256(folder, weights) == "c" * 64
    tensors = folder / "model.safetensors"
    stat = tensors.stat()
    os.utime(tensors, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # saved again
    assert weights_sha256(folder, weights) == real


def test_weights_without_files_are_hashed_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv("TRT_KV_CACHE", str(tmp_path / "cache"))
    assert source_files(tmp_path / "missing.gguf") == []
    weights = load_model(write_tiny_model(tmp_path / "tiny"), progress=False).weights
    assert weights_sha256(tmp_path / "missing.gguf", weights) == weights_digest(weights)
    assert not (tmp_path / "cache").exists()


def test_a_cache_variable_naming_a_file_is_one_line_naming_it(tmp_path):
    """Before: a NotADirectoryError traceback from weights_sha256's own ``except OSError``."""
    from tests.support.cli_user import run_cli

    taken = tmp_path / "a-file"
    taken.write_text("")
    model = write_tiny_model(tmp_path / "tiny")
    argv = ["build", "--model", model, "--out", tmp_path / "engines", "--max-seq-len", "16"]
    out = run_cli(*argv, check=False, TRT_KV_CACHE=str(taken))
    assert (out.returncode, out.stderr) == (
        2,
        f"trt-kv: error: TRT_KV_CACHE: expected a directory, got {taken} (a file)\n",
    )
    assert not (tmp_path / "engines").exists()  # refused before anything was built


def test_a_same_size_rewrite_with_its_mtime_restored_is_hashed_anew(tmp_path, monkeypatch):
    """Before: the old weights' digest, so their engine was "reused" for the new weights."""
    from tests.engine.test_engine_identity import _resave

    monkeypatch.setenv("TRT_KV_CACHE", str(tmp_path / "cache"))
    folder = write_tiny_model(tmp_path / "tiny")
    tensors = folder / "model.safetensors"
    before = tensors.stat()
    old = weights_sha256(folder, load_model(folder, progress=False).weights)  # cached
    _resave(folder, seed=5)  # other weights, same names and shapes: same size
    os.utime(tensors, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back
    after = tensors.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    new = load_model(folder, progress=False).weights
    assert weights_sha256(folder, new) == weights_digest(new) != old
