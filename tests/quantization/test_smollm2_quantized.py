"""The real default model with its weights kept quantized (``weight_format="keep"``): its
210 Q4_1 matrices as INT4 blocks with minimums, and the Q8_0 embedding its tied head reads as
INT8 blocks. Oracles: gguf's own dequantization for the
stored blocks, the float16-weight network for the logits, Hugging Face's greedy ids for the
two prompts (24 tokens), and the same answer printed by ``trt-kv generate --weights keep``
from a TensorRT-RTX engine run on the emulated device."""

import gc
import json

import numpy as np

from tests.support.real_model import (
    CHAT_ANSWER,
    CHAT_IDS,
    CHAT_PROMPT_IDS,
    CHAT_QUESTION,
    PLAIN_IDS,
    PLAIN_PROMPT_IDS,
)
from trt_kv.cli import main
from trt_kv.interpreter import blocks, compile_network
from trt_kv.models.llama import build_llama_network, to_hf_tensors
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

S_MAX = 64


def test_the_default_gguf_keeps_its_q4_1_matrices_and_q8_0_embedding(smollm2):
    kinds = {}
    for q in smollm2.weights.quantized.values():
        kinds[q.source] = kinds.get(q.source, 0) + 1
    assert kinds == {"Q4_1": 210, "Q8_0": 1}


def test_kept_matrices_dequantize_bit_for_bit_as_gguf(smollm2):
    """``smollm2.weights`` holds gguf's float32 dequantization (Q/K rows un-permuted, which
    test_smollm2 checks against transformers); the kept blocks give the same bits."""
    floats = to_hf_tensors(smollm2.weights)
    for name, q in smollm2.weights.quantized.items():
        assert np.array_equal(q.dequantize().view(np.uint32), floats[name].view(np.uint32)), name


def _network(model, dtype, weight_format, max_batch=1, all_logits=False):
    return build_llama_network(
        model.config,
        model.weights,
        max_seq_len=S_MAX,
        max_batch=max_batch,
        max_step_tokens=40,
        dtype=dtype,
        weight_format=weight_format,
        all_logits=all_logits,
    )


def _prefill_logits(model, dtype, weight_format):
    net = _network(model, dtype, weight_format, all_logits=True)
    ids = np.array([CHAT_PROMPT_IDS], dtype=np.int32)
    s = ids.shape[1]
    plan = compile_network(net.network)
    feed = {
        "input_ids": ids,
        "position_ids": np.arange(s, dtype=np.int64)[None],
        "write_indices": np.zeros(1, np.int32),
    }
    cfg = model.config
    cache = np.zeros((1, cfg.num_key_value_heads, S_MAX, cfg.head_dim), dtype=dtype)
    feed |= {n: cache.copy() for n in plan.input_names if n.startswith("past_")}
    return plan.run(feed)["logits"][0].astype(np.float64)  # [S, V]


def test_kept_logits_equal_the_float_weights_within_rounding(smollm2):
    """In float32 the decomposed Q4_1 product (``x (d c)^T + sums (8 d + m)^T``) is the
    product with gguf's weights up to float32 rounding. In float16 it rounds twice per block
    (``d c`` and ``8 d + m``) where the float16-weight network rounds each weight once: its
    logits stay within twice the float16 network's own distance from the float32 one."""
    full = _prefill_logits(smollm2, "float32", None)
    kept32 = _prefill_logits(smollm2, "float32", "keep")
    assert np.abs(kept32 - full).max() <= 1e-4 * np.abs(full).max()
    half = _prefill_logits(smollm2, "float16", None)
    kept = _prefill_logits(smollm2, "float16", "keep")
    assert 0 < np.abs(kept - full).max() <= 2 * np.abs(half - full).max()
    assert np.array_equal(kept.argmax(-1), half.argmax(-1))


def test_kept_weights_greedy_ids_equal_hugging_face(smollm2):
    """Through the fused block products (counted: 4 calls a layer and step, Q/K/V and
    gate/up stacked, plus the tied head's Q8_0 blocks)."""
    session = Session(InterpreterBackend(_network(smollm2, "float16", "keep", max_batch=2)))
    prompts = [CHAT_PROMPT_IDS, PLAIN_PROMPT_IDS]
    before = sum(blocks.COUNTS.values())
    assert generate(session, prompts, 24).ids == [CHAT_IDS, PLAIN_IDS]
    assert sum(blocks.COUNTS.values()) - before >= (4 * smollm2.config.num_hidden_layers + 1) * 24


def test_the_tied_head_multiplies_the_q8_0_blocks_and_the_embedding_is_held_once(smollm2):
    """With ``keep`` the network gathers from the Q8_0 embedding's dequantized table (gguf's
    values: ``test_kept_matrices_dequantize_bit_for_bit_as_gguf``) and the tied head
    multiplies its blocks as stored: the plan holds the ``[V, D]`` codes 8 bits wide, one
    byte a weight, and the network holds no float matrix."""
    before = {id(o) for o in gc.get_objects() if isinstance(o, blocks.BlockWeight)}
    net = _network(smollm2, "float16", "keep")
    plan = compile_network(net.network)
    held = [
        o for o in gc.get_objects() if isinstance(o, blocks.BlockWeight) and id(o) not in before
    ]
    shape = (smollm2.config.vocab_size, smollm2.config.hidden_size)
    [head] = [w for w in held if w.shape == shape]
    assert (head.bits, head.block, head.offsets) == (8, 32, None)
    assert head.codes.nbytes == shape[0] * shape[1]
    assert net.weight_storage["activation_dtype"]["matrices"] == []
    del plan


def test_generate_weights_keep_prints_todays_answer_from_a_quantized_engine(tmp_path, capsys):
    argv = ["generate", "--prompt", CHAT_QUESTION, "--chat", "--weights", "keep"]
    argv += ["--backend", "tensorrt", "--max-seq-len", "64", "--max-batch", "1"]
    argv += ["--max-new-tokens", "16", "--out", str(tmp_path), "--emulate-gpu"]
    assert main(argv) == 0
    assert capsys.readouterr().out == CHAT_ANSWER + "\n"
    [engine] = tmp_path.glob("*-weights_keep*.engine")
    sidecar = json.loads(engine.with_suffix(".engine.json").read_text())
    weights = sidecar["metadata"]["weights"]
    assert weights["quantized"] == {"Q4_1 -> int4 block 32 + mins": 210, "Q8_0 -> int8 block 32": 1}
    assert weights["exact"] == ["Q4_1", "Q8_0"] and weights["requantized"]["count"] == 0
    assert weights["activation_dtype"]["matrices"] == []
