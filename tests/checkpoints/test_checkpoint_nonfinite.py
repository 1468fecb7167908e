"""A checkpoint holding NaN or infinite weights is refused at load, naming the tensor and
how many values (it ran before and gave argmax-of-NaN tokens: ``[0, 0, ...]``), for every
format and dtype; GGUF tensors are checked once dequantized, as the model gets them."""

import ml_dtypes
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants
from safetensors.torch import save_file

from tests.support.gguf_files import write_gguf
from trt_kv.checkpoints import read_gguf
from trt_kv.checkpoints.hf import read_safetensors
from trt_kv.errors import ConfigError

ROWS, COLS = 4, 64


def _weights(dtype=np.float32):
    return np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(dtype)


def _gguf(tmp_path, value, **kwargs):
    path = write_gguf(tmp_path / "w.gguf", "llama", {}, {"token_embd.weight": value})
    return read_gguf(path, **kwargs)


@pytest.mark.parametrize(
    ("stored", "got"),
    [
        (np.float32, "1 NaN and 2 infinite of 256 float32 values"),
        (np.float16, "1 NaN and 2 infinite of 256 float32 values"),
    ],
    ids=["F32", "F16"],
)
def test_gguf_float_tensors_with_nan_or_inf_are_refused(tmp_path, stored, got):
    w = _weights(stored)
    w[0, 3], w[1, 5], w[2, 7] = np.nan, np.inf, -np.inf
    with pytest.raises(
        ConfigError, match=f"^w.gguf: token_embd.weight: expected finite weights, got {got}$"
    ):
        _gguf(tmp_path, w)


def test_gguf_bf16_nan_is_refused(tmp_path):
    w = _weights()
    w[3, 0] = np.nan
    raw = quants.quantize(w, Q.BF16)
    with pytest.raises(ConfigError, match=r"token_embd\.weight: .* got 1 NaN and 0 infinite"):
        _gguf(tmp_path, (raw, Q.BF16))


def test_gguf_quantized_block_with_a_nan_scale_is_refused_after_dequantizing(tmp_path):
    """Q8_0: a block is an f16 scale and 32 int8; a NaN scale makes all 32 values NaN."""
    raw = quants.quantize(_weights(), Q.Q8_0)  # [4, 2 blocks * 34 bytes]
    raw[1, 34:36] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    with pytest.raises(ConfigError, match="got 32 NaN and 0 infinite of 256 float32 values"):
        _gguf(tmp_path, (raw, Q.Q8_0))


def test_gguf_values_past_float16_are_refused_when_read_as_float16(tmp_path):
    w = _weights()
    w[0, 0] = 1e6  # finite in float32, inf in float16
    assert np.isfinite(_gguf(tmp_path, w).tensors["model.embed_tokens.weight"]).all()
    with pytest.raises(ConfigError, match="got 0 NaN and 1 infinite of 256 float16 values"):
        _gguf(tmp_path, w, dtype=np.float16)


@pytest.mark.parametrize(
    ("dtype", "shown"),
    [(torch.float32, "float32"), (torch.float16, "float16"), (torch.bfloat16, "bfloat16")],
)
def test_safetensors_with_nan_or_inf_are_refused(tmp_path, dtype, shown):
    good = torch.from_numpy(_weights()).to(dtype)
    bad = good.clone()
    bad[2, 2], bad[3, 3] = float("nan"), float("-inf")
    save_file({"model.norm.weight": good, "model.embed_tokens.weight": bad}, tmp_path / "m.st")
    message = (
        "^m.st: model.embed_tokens.weight: expected finite weights, "
        f"got 1 NaN and 1 infinite of 256 {shown} values$"
    )
    with pytest.raises(ConfigError, match=message):
        read_safetensors([tmp_path / "m.st"])


def test_finite_checkpoints_load_unchanged(tmp_path):
    w = _weights(ml_dtypes.bfloat16)
    save_file({"a": torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16)}, tmp_path / "m.st")
    np.testing.assert_array_equal(read_safetensors([tmp_path / "m.st"])["a"], w)
