"""Finite weights that overflow where the network holds them (issue 37): a float weight of
1e5 cast to float16, a weight of 1e7 quantized to int8/int4 (its float16 block scale
overflows), a GGUF Q8_0 block scale of 60000 kept quantized in a float16 network (its
dequantized weights reach 60000 * 127). Each ran and gave ids ``[0, 0, ...]``; each is
refused when the network is built, naming the tensor and the largest value the dtype holds.
bfloat16 and float32 hold the same float values and build."""

import numpy as np
import pytest
import transformers
from gguf import GGMLQuantizationType as Q
from gguf import quants
from safetensors.numpy import load_file, save_file

from tests.support.cli_user import run_cli
from tests.support.gguf_files import llama_gguf_tensors, llama_metadata, write_gguf
from tests.support.gpt2_models import save_gpt2
from tests.support.hf_models import save_random_model
from tests.support.tiny_models import TINY_HF_CONFIG
from trt_kv.errors import ConfigError
from trt_kv.models.architectures import architecture_of
from trt_kv.models.loading import load_model

LLAMA_DOWN = "model.layers.0.mlp.down_proj.weight"  # [32, 64]
GPT2_FC = "transformer.h.0.mlp.c_fc.weight"  # Conv1D [60, 97]
HOLDS = r"expected values float16 holds \(\|w\| <= 65504\)"


def _llama(folder):
    config = transformers.LlamaConfig(**TINY_HF_CONFIG)
    return save_random_model(transformers.LlamaForCausalLM, config, folder)


def _with_value(folder, save, name, value):
    """``save(folder)``, then ``name[0, 1] = value`` in its safetensors."""
    save(folder)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors[name][0, 1] = value
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


def _build(spec, dtype, weight_format=None):
    model = load_model(spec, progress=False)
    arch = architecture_of(model.config)
    return arch.build_network(
        model.config, model.weights, max_seq_len=16, max_batch=1, dtype=dtype,
        weight_format=weight_format,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("save", "name", "shown"),
    [(_llama, LLAMA_DOWN, LLAMA_DOWN), (save_gpt2, GPT2_FC, "h.0.mlp.c_fc.weight")],
    ids=["llama", "gpt2"],
)
def test_a_float_weight_past_float16_is_refused_at_build_naming_it(tmp_path, save, name, shown):
    folder = _with_value(tmp_path, save, name, -1e5)
    with pytest.raises(ConfigError, match=rf"^{shown}: {HOLDS}, got \|w\| up to 1e\+05$"):
        _build(folder, "float16")
    for dtype in ("bfloat16", "float32"):  # 1e5 fits: built
        assert _build(folder, dtype).dtype == dtype


@pytest.mark.parametrize("bits", ["int8", "int4"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_weight_whose_float16_block_scale_overflows_is_refused_in_every_dtype(
    tmp_path, bits, dtype
):
    """1e7 / 127 (int8) or / 7 (int4) is past float16, where build-time quantization rounds
    the scale: inf, then NaN weights, whatever the activation dtype."""
    folder = _with_value(tmp_path, _llama, LLAMA_DOWN, 1e7)
    limit = {"float16": "65504", "bfloat16": r"3\.38953e\+38", "float32": r"3\.40282e\+38"}
    expected = (
        rf"^{LLAMA_DOWN}: expected values {dtype} holds \(\|w\| <= {limit[dtype]}\) as {bits} "
        rf"block 32 \(from {bits}\), got a block scale past float16's range \(float \|w\| up "
        r"to 1e\+07\)$"
    )
    with pytest.raises(ConfigError, match=expected):
        _build(folder, dtype, bits)


def test_int8_weights_past_float16_are_refused_in_float16_and_build_in_bfloat16(tmp_path):
    """1e5 quantizes (scale 787) but dequantizes past float16 in a float16 network."""
    folder = _with_value(tmp_path, _llama, LLAMA_DOWN, 1e5)
    with pytest.raises(ConfigError, match=rf"^{LLAMA_DOWN}: {HOLDS} as int8 .*got \|w\| up to"):
        _build(folder, "float16", "int8")
    assert _build(folder, "bfloat16", "int8").weight_format == "int8"


def test_a_gguf_q8_0_scale_whose_weights_pass_float16_is_refused_when_kept(tmp_path):
    """A Q8_0 block is a float16 scale and 32 int8 codes: 60000 fits float16, 60000 * 127
    does not; ``--weights keep`` dequantizes in the network's dtype."""
    hf = _llama(tmp_path / "hf")
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    tensors = llama_gguf_tensors(state, hf.config)
    down = tensors["blk.0.ffn_down.weight"]  # [32, 64]: two blocks per row
    raw = quants.quantize(down, Q.Q8_0)  # [32, 2 * 34] bytes
    raw[0, 0:2] = np.frombuffer(np.float16(60000).tobytes(), np.uint8)
    raw[0, 2:34] = np.frombuffer(np.int8([127] * 32).tobytes(), np.uint8)
    tensors["blk.0.ffn_down.weight"] = (raw, Q.Q8_0)
    path = write_gguf(tmp_path / "m.gguf", "llama", llama_metadata(hf.config), tensors)
    expected = (
        rf"^{LLAMA_DOWN}: {HOLDS} as int8 block 32 \(from Q8_0\), got \|w\| up to 7\.62e\+06$"
    )
    with pytest.raises(ConfigError, match=expected):
        _build(path, "float16", "keep")
    assert _build(path, "bfloat16", "keep").weight_format == "keep"


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path):
    folder = _with_value(tmp_path, _llama, LLAMA_DOWN, 1e5)
    out = run_cli(
        "generate", "--model", folder, "--backend", "interpreter", "--dtype", "float16",
        "--max-seq-len", "16", "--prompt-ids", "1,2,3", check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        f"trt-kv: error: {LLAMA_DOWN}: expected values float16 holds (|w| <= 65504), "
        "got |w| up to 1e+05"
    )
