"""The GGUF reader: every tensor type it must dequantize, llama.cpp's Q/K row permutation
undone, names and config mapped, and files it must refuse.

Files are written with the ``gguf`` package's own writer. Quantized tensors are checked
against an independent dequantizer (transformers' torch implementation of the ggml blocks),
against hand-made blocks whose values are worked out in the test, and quantize-then-read
against the input.
"""

import dataclasses
import json
import re

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf import quants
from transformers.integrations.gguf.dequant import dequantize as hf_dequantize

from tests.support.gguf_files import (
    llama_cpp_permute,
    llama_gguf_tensors,
    llama_metadata,
    patch_tensor_info,
    write_gguf,
)
from tests.support.tiny_models import TINY_GQA, TINY_HF_CONFIG
from trt_kv.checkpoints import read_gguf
from trt_kv.checkpoints.gguf import unpermute_rows
from trt_kv.checkpoints.gguf_archs import hf_config
from trt_kv.cli import main
from trt_kv.errors import ConfigError
from trt_kv.models.llama import LlamaConfig

ROWS, COLS = 4, 512  # two 256-value super-blocks per row (K-quants), sixteen 32-blocks


def _read_one(tmp_path, value):
    """Write ``value`` as ``token_embd.weight`` and read it back as float32 ``[rows, cols]``."""
    path = write_gguf(tmp_path / "t.gguf", "llama", {}, {"token_embd.weight": value})
    return read_gguf(path).tensors["model.embed_tokens.weight"]


def _f16_bytes(x):
    return np.frombuffer(np.float16(x).tobytes(), np.uint8)


# -- float types --------------------------------------------------------------------------


def test_f32_and_f16_read_back_exactly(tmp_path):
    x = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    np.testing.assert_array_equal(_read_one(tmp_path, x), x)
    np.testing.assert_array_equal(_read_one(tmp_path, x.astype(np.float16)), x.astype(np.float16))


def test_bf16_reads_back_as_the_rounded_input(tmp_path):
    x = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
    raw = quants.quantize(x, Q.BF16)  # uint8 [rows, 2 * cols]
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)  # round to nearest even
    np.testing.assert_array_equal(_read_one(tmp_path, (raw, Q.BF16)), expected)


# -- quantized types against an independent dequantizer -----------------------------------


def _random_k_blocks(qtype, rng):
    """Random K-quant bytes with finite fp16 scales where the format puts them."""
    block = {Q.Q4_K: 144, Q.Q6_K: 210}[qtype]
    raw = rng.integers(0, 256, (ROWS * COLS // 256, block), dtype=np.uint8)
    scales = np.abs(rng.standard_normal((raw.shape[0], 2))).astype(np.float16) * 0.01
    if qtype == Q.Q4_K:  # d, dmin first
        raw[:, 0:4] = scales.view(np.uint8)
    else:  # Q6_K: d last
        raw[:, 208:210] = scales[:, :1].view(np.uint8)
    return raw.reshape(ROWS, -1)


def _bytes_of(qtype, rng):
    if qtype in (Q.Q4_K, Q.Q6_K):  # gguf has no quantizer for these: random valid blocks
        return _random_k_blocks(qtype, rng)
    return quants.quantize(rng.standard_normal((ROWS, COLS)).astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_quantized_type_matches_transformers_dequantizer(tmp_path, qtype):
    raw = _bytes_of(qtype, np.random.default_rng(int(qtype)))
    ours = _read_one(tmp_path, (raw, qtype))
    theirs = hf_dequantize(torch.from_numpy(raw.copy()).reshape(-1), int(qtype)).numpy()
    assert ours.shape == (ROWS, COLS)
    np.testing.assert_allclose(ours, theirs.reshape(ROWS, COLS), rtol=1e-6, atol=1e-7)


# (type, steps over the block's span, error bound in steps): Q4_0's levels -8..7 times
# d = max/-8 clip the far side of a block by up to one step.
QUANTIZERS = [(Q.Q8_0, 127, 0.51), (Q.Q4_0, 8, 1.01), (Q.Q4_1, 15, 0.51)]


@pytest.mark.parametrize(("qtype", "levels", "bound"), QUANTIZERS, ids=["Q8_0", "Q4_0", "Q4_1"])
def test_quantize_then_read_is_within_its_step(tmp_path, qtype, levels, bound):
    x = np.random.default_rng(3).standard_normal((ROWS, COLS)).astype(np.float32)
    got = _read_one(tmp_path, (quants.quantize(x, qtype), qtype))
    blocks = x.reshape(-1, 32)
    span = np.ptp(blocks, axis=1) if qtype == Q.Q4_1 else np.abs(blocks).max(axis=1)
    step = np.repeat(span / levels, 32).reshape(x.shape)
    assert np.all(np.abs(got - x) <= bound * step + 1e-3 * np.abs(x))


# -- hand-made blocks, values worked out here -----------------------------------------------


def test_q8_0_block_is_scale_times_int8(tmp_path):
    q = np.arange(-16, 16, dtype=np.int8)  # one block of 32
    raw = np.concatenate([_f16_bytes(0.5), q.view(np.uint8)])[None]
    np.testing.assert_array_equal(_read_one(tmp_path, (raw, Q.Q8_0)), 0.5 * q[None])


def test_q4_0_block_is_scale_times_nibble_minus_8(tmp_path):
    # byte j holds element j (low nibble) and element j + 16 (high nibble)
    lo, hi = np.arange(16, dtype=np.uint8), np.full(16, 9, np.uint8)
    raw = np.concatenate([_f16_bytes(2.0), lo | (hi << 4)])[None]
    expected = 2.0 * (np.concatenate([lo, hi]).astype(np.float32) - 8)
    np.testing.assert_array_equal(_read_one(tmp_path, (raw, Q.Q4_0)), expected[None])


def test_q4_k_block_with_unit_scales_is_its_nibbles(tmp_path):
    # d = 1, dmin = 0; the 6-bit scales of all 8 sub-blocks 1, mins 0 (ggml's 12-byte
    # packing: bytes 0-3 scales 0-3, 4-7 mins 0-3, 8-11 low nibble scales 4-7, high mins 4-7)
    scales = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)
    qs = np.full(128, 0x21, np.uint8)  # per 64 values: 32 low nibbles (1), 32 high (2)
    raw = np.concatenate([_f16_bytes(1.0), _f16_bytes(0.0), scales, qs])[None]
    expected = np.tile(np.repeat([1.0, 2.0], 32), 4)
    np.testing.assert_array_equal(_read_one(tmp_path, (raw, Q.Q4_K)), expected[None])


def test_q6_k_block_with_zero_quants_is_minus_32_times_scale(tmp_path):
    # ql = qh = 0 gives q = 0 -> value d * scale * (0 - 32); sub-block i (16 values) scale i
    scales = np.arange(16, dtype=np.int8)
    raw = np.concatenate([np.zeros(192, np.uint8), scales.view(np.uint8), _f16_bytes(1.0)])[None]
    expected = np.repeat(-32.0 * np.arange(16), 16)
    np.testing.assert_array_equal(_read_one(tmp_path, (raw, Q.Q6_K)), expected[None])


# -- a whole Llama: names, permutation, config ---------------------------------------------

# GQA 4:2 with an untied head, so output.weight is written and read too.
TINY_CONFIG = dataclasses.replace(TINY_GQA, tie_word_embeddings=False, max_position_embeddings=128)
TINY = transformers.LlamaConfig(
    **{k: v for k, v in dataclasses.asdict(TINY_CONFIG).items() if k != "rope_scaling"}
)


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory):
    """``(folder, hf state dict)``: a random transformers Llama written as llama.cpp would."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(TINY)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    folder = tmp_path_factory.mktemp("tiny_gguf")
    write_gguf(folder / "tiny.gguf", "llama", llama_metadata(TINY), llama_gguf_tensors(state, TINY))
    return folder, state, model


def test_llama_gguf_gives_the_hugging_face_tensors(tiny_llama_gguf):
    folder, state, _ = tiny_llama_gguf
    tensors = read_gguf(folder / "tiny.gguf").tensors
    assert sorted(tensors) == sorted(state)
    for name, array in state.items():
        np.testing.assert_array_equal(tensors[name], array, err_msg=name)


def test_llama_gguf_equals_what_transformers_loads_from_it(tiny_llama_gguf):
    folder, _, _ = tiny_llama_gguf
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file="tiny.gguf", dtype=torch.float32
    )
    tensors = read_gguf(folder / "tiny.gguf").tensors
    for name, value in hf.state_dict().items():
        np.testing.assert_array_equal(tensors[name], value.numpy(), err_msg=name)


def test_llama_gguf_config_reads_into_the_same_shape(tiny_llama_gguf):
    folder, _, _ = tiny_llama_gguf
    config = LlamaConfig.from_hf(read_gguf(folder / "tiny.gguf").config)
    eps = float(np.float32(TINY_CONFIG.rms_norm_eps))  # GGUF stores float32
    assert config == dataclasses.replace(TINY_CONFIG, rms_norm_eps=eps)


def test_trt_kv_generate_on_a_gguf_file_gives_hugging_face_greedy_ids(tiny_llama_gguf, capsys):
    folder, _, model = tiny_llama_gguf
    prompt = [5, 17, 3, 42]
    expected = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, 4, dtype=torch.long),
        do_sample=False,
        max_new_tokens=6,
        eos_token_id=None,
        pad_token_id=0,
    )[0, 4:].tolist()
    argv = ["generate", "--model", str(folder / "tiny.gguf"), "--prompt-ids", "5,17,3,42"]
    assert main([*argv, "--max-new-tokens", "6", "--backend", "reference", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == [expected]


@pytest.mark.parametrize("shape", [(4 * 8, 5), (2 * 6,)], ids=["matrix", "bias"])
def test_unpermute_inverts_llama_cpp_permute(shape):
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    n_head = 4 if shape[0] == 32 else 2
    np.testing.assert_array_equal(unpermute_rows(llama_cpp_permute(w, n_head), n_head), w)


def test_unpermute_of_rows_that_do_not_split_into_the_heads_is_refused():
    with pytest.raises(ConfigError, match=r"rows: expected a multiple of 2 \* 4 heads, got 30"):
        unpermute_rows(np.zeros((30, 5), np.float32), 4)


def test_q_rows_that_do_not_split_into_the_heads_are_refused_naming_the_tensor(tmp_path):
    meta = {"llama.attention.head_count": 4, "llama.embedding_length": 16}
    tensors = {**EMBED, "blk.0.attn_q.weight": np.zeros((12, 16), np.float32)}
    path = write_gguf(tmp_path / "q.gguf", "llama", meta, tensors)
    message = r"blk\.0\.attn_q\.weight rows: expected a multiple of 2 \* 4 heads, got 12"
    with pytest.raises(ConfigError, match=message):
        read_gguf(path)


# -- refused files ------------------------------------------------------------------------


def test_other_architecture_is_refused_naming_it(tmp_path):
    x = np.zeros((4, 8), np.float32)
    path = write_gguf(
        tmp_path / "g.gguf", "gemma2", {"gemma2.block_count": 1}, {"token_embd.weight": x}
    )
    expected = "['gemma', 'llama', 'mistral3', 'phi3', 'qwen2', 'qwen3']"
    with pytest.raises(
        ConfigError,
        match=rf"general\.architecture: expected one of {re.escape(expected)}, got 'gemma2'",
    ):
        read_gguf(path)


def test_hf_config_of_another_architecture_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"general\.architecture: expected one of .*got 'gemma2'"):
        hf_config(lambda key, default=None: default, "gemma2", set(), {})


def test_unknown_tensor_is_refused_naming_it(tmp_path):
    path = write_gguf(
        tmp_path / "u.gguf", "llama", {}, {"blk.0.attn_sinks": np.zeros(4, np.float32)}
    )
    with pytest.raises(ConfigError, match=r"unknown \['blk\.0\.attn_sinks'\]"):
        read_gguf(path)


def test_rope_factors_other_than_llama3_are_refused(tmp_path):
    meta = {"llama.attention.head_count": 2, "llama.embedding_length": 16}  # head size 8
    path = write_gguf(
        tmp_path / "r.gguf", "llama", meta, {"rope_freqs.weight": np.full(4, 2.0, np.float32)}
    )
    with pytest.raises(ConfigError, match=r"rope_freqs\.weight: expected Llama 3 RoPE factors"):
        read_gguf(path)


EMBED = {"token_embd.weight": np.zeros((4, 16), np.float32)}
HEADS = {"attention.head_count": 2, "embedding_length": 16}  # head size 8


@pytest.mark.parametrize(
    ("arch", "key", "value", "message"),
    [
        ("qwen2", "attention.sliding_window", 4, "0 \\(no sliding window\\), got 4"),
        ("qwen3", "rope.dimension_count", 4, "the head size 8, got 4"),
        ("llama", "expert_count", 8, "no experts \\(dense MLP\\), got 8"),
        ("gemma", "final_logit_softcapping", 30.0, "no final logit soft-capping, got 30.0"),
        ("mistral3", "attention.temperature_scale", 0.1, "no attention temperature scaling"),
        ("phi3", "attention.value_length", 4, "the key length 8, got 4"),
        ("phi3", "rope.dimension_count", 3, "an even rotary size below the head size 8, got 3"),
    ],
)
def test_metadata_that_changes_the_network_and_is_not_built_is_refused(
    tmp_path, arch, key, value, message
):
    meta = {f"{arch}.{k}": v for k, v in {**HEADS, key: value}.items()}
    path = write_gguf(tmp_path / "k.gguf", arch, meta, EMBED)
    with pytest.raises(ConfigError, match=rf"{arch}\.{re.escape(key)}: expected {message}"):
        read_gguf(path)


@pytest.mark.parametrize(
    ("present", "missing"),
    [("rope_factors_short", "rope_factors_long"), ("rope_factors_long", "rope_factors_short")],
)
def test_one_longrope_factor_tensor_alone_is_refused_naming_the_missing_one(
    tmp_path, present, missing
):
    meta = {f"phi3.{k}": v for k, v in HEADS.items()}
    meta["phi3.rope.scaling.original_context_length"] = 16
    tensors = {**EMBED, f"{present}.weight": np.ones(4, np.float32)}
    path = write_gguf(tmp_path / "f.gguf", "phi3", meta, tensors)
    message = rf"{missing}\.weight: expected a tensor beside {present}\.weight, got 'no such"
    with pytest.raises(ConfigError, match=message):
        read_gguf(path)


def test_rope_scaling_kind_not_built_is_refused_by_the_config(tmp_path):
    meta = {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0}
    config = read_gguf(write_gguf(tmp_path / "y.gguf", "qwen2", meta, EMBED)).config
    assert config["rope_parameters"]["rope_type"] == "yarn"
    with pytest.raises(ConfigError, match=r"rope_type: expected one of .* got 'yarn'"):
        LlamaConfig.from_hf({**TINY_HF_CONFIG, **config})


def test_output_bias_in_qwen2_is_refused_by_the_family(tmp_path):
    tensors = {**EMBED, "blk.0.attn_output.bias": np.zeros(16, np.float32)}
    config = read_gguf(write_gguf(tmp_path / "o.gguf", "qwen2", {}, tensors)).config
    assert config["attention_bias"] is True
    with pytest.raises(ConfigError, match=r"attention_bias: expected false .*qwen2"):
        LlamaConfig.from_hf({**TINY_HF_CONFIG, **config})


def test_attention_biases_reach_the_config_and_are_refused(tmp_path, tiny_llama_gguf):
    _, state, _ = tiny_llama_gguf
    tensors = llama_gguf_tensors(state, TINY)
    tensors["blk.0.attn_q.bias"] = np.zeros(4 * 8, np.float32)
    path = write_gguf(tmp_path / "b.gguf", "llama", llama_metadata(TINY), tensors)
    checkpoint = read_gguf(path)
    assert checkpoint.config["attention_bias"] is True
    with pytest.raises(ConfigError, match=r"attention_bias.*got true"):
        LlamaConfig.from_hf(checkpoint.config)


def test_malformed_file_is_a_config_error_with_the_cause(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + bytes(range(60)))
    with pytest.raises(ConfigError, match=r"bad\.gguf: expected a GGUF file") as info:
        read_gguf(path)
    assert info.value.__cause__ is not None


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="missing"):
        read_gguf(tmp_path / "none.gguf")


# -- tensor data where llama.cpp wants it: in order, contiguous, sized by type ---------------

Q_ROWS = np.random.default_rng(5).standard_normal((32, 64)).astype(np.float32)


def _two_tensor_file(tmp_path, last=None):
    """blk.0.attn_q (F32 [32, 64], 8192 bytes), blk.1.attn_q, and ``last`` when given."""
    tensors = {"blk.0.attn_q.weight": Q_ROWS, "blk.1.attn_q.weight": Q_ROWS + 1}
    if last is not None:
        tensors["token_embd.weight"] = last
    return write_gguf(tmp_path / "m.gguf", "llama", {}, tensors)


def test_a_type_in_the_header_other_than_the_data_written_is_refused_naming_the_tensor(
    tmp_path,
):
    path = _two_tensor_file(tmp_path)
    patch_tensor_info(path, "blk.0.attn_q.weight", qtype=Q.Q8_0)  # F32 bytes, read as Q8_0
    expected = (
        r"^m\.gguf: tensor blk\.1\.attn_q\.weight: expected data at offset 2176 \(after "
        r"blk\.0\.attn_q\.weight's 2176 bytes of Q8_0 \[64, 32\], padded to 32\), got 8192$"
    )
    with pytest.raises(ConfigError, match=expected):
        read_gguf(path)


def test_two_tensors_at_the_same_data_offset_are_refused_naming_the_second(tmp_path):
    path = _two_tensor_file(tmp_path)
    first = patch_tensor_info(path, "blk.0.attn_q.weight")
    assert patch_tensor_info(path, "blk.1.attn_q.weight", offset=first) == 8192
    expected = r"^m\.gguf: tensor blk\.1\.attn_q\.weight: expected data at offset 8192 .*got 0$"
    with pytest.raises(ConfigError, match=expected):
        read_gguf(path)


def test_a_last_tensor_typed_smaller_than_its_data_is_refused_by_the_file_size(tmp_path):
    path = _two_tensor_file(tmp_path, last=Q_ROWS[:8])  # F32 [8, 64]: 2048 bytes, last
    patch_tensor_info(path, "token_embd.weight", qtype=Q.Q8_0)  # read as 544 bytes
    size = path.stat().st_size
    expected = (
        rf"^m\.gguf: size: expected {size - 2048 + 544} bytes \(the last tensor, "
        rf"token_embd\.weight, ends at {size - 2048 + 544}; only its padding to 32 after "
        rf"it\), got {size} bytes$"
    )
    with pytest.raises(ConfigError, match=expected):
        read_gguf(path)
