"""Hand-written ONNX decoders (tests.support.onnx_toy_decoders.py): a Concat + Softmax layer and an
opset-23 ``Attention`` node with ``past_key`` / ``past_value`` (which TensorRT's parser
refuses as it is), rewritten and run by trt_kv with onnxruntime's ids on the original graph;
and every refusal, each a named TrtKvError, with nothing written by ``trt-kv build``."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper as h

from tests.support.cli_user import run_cli
from tests.support.onnx_models import NEW_TOKENS, ort_greedy
from tests.support.onnx_toy_decoders import toy_decoder
from trt_kv.errors import NetworkError, ShapeError, UnsupportedLayerError
from trt_kv.onnx.decoder import load_onnx_decoder
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 4], [11, 12, 13, 14]]


def _saved(model: onnx.ModelProto, tmp_path, name: str = "toy.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _load(path):
    return load_onnx_decoder(path, max_seq_len=64, max_batch=3, max_step_tokens=8)


@pytest.mark.parametrize("kind", ["matmul", "attention"])
def test_interpreter_ids_equal_onnxruntime_on_the_original(kind, tmp_path):
    path = _saved(toy_decoder(kind), tmp_path)
    want = [ort_greedy(path, p, NEW_TOKENS) for p in PROMPTS]
    got = generate(Session(InterpreterBackend(_load(path).decoder)), PROMPTS, NEW_TOKENS).ids
    assert got == want


def test_attention_node_with_a_past_is_written_out_and_its_caches_rewritten(tmp_path):
    from trt_kv.onnx.parse import parse_decoder

    model = toy_decoder("attention")
    refusal = (
        "ONNX node attention_0 .Attention.: .* TensorRT only supports Attention nodes with one"
    )
    with pytest.raises(UnsupportedLayerError, match=refusal):  # the parser, as it is
        parse_decoder(model.SerializeToString(), tmp_path, max_batch=1, max_step_tokens=1)
    d = _load(_saved(model, tmp_path))
    assert d.report.attention_nodes == 1
    assert [c[:2] for c in d.report.caches] == [
        ("past_key_values.0.key", "present.0.key"),
        ("past_key_values.0.value", "present.0.value"),
    ]


def _unpaired() -> onnx.ModelProto:
    """The key cache scaled before its concat: no graph input is concatenated."""
    model = toy_decoder()
    g = model.graph
    concat = next(n for n in g.node if n.op_type == "Concat" and n.output[0] == "present.0.key")
    concat.input[0] = "past_scaled"
    g.node.insert(0, h.make_node("Mul", ["past_key_values.0.key", "scale"], ["past_scaled"]))
    return model


def _with_node(op: str, domain: str = "", **attrs: object) -> onnx.ModelProto:
    """The toy with ``op`` on its logits (an ONNX node named ``odd_op``)."""
    model = toy_decoder()
    g = model.graph
    g.node[-1].output[0] = "raw_logits"
    g.node.append(
        h.make_node(op, ["raw_logits"], ["logits"], name="odd_op", domain=domain, **attrs)
    )
    if domain:
        model.opset_import.append(h.make_opsetid(domain, 1))
    return model


def _gqa() -> onnx.ModelProto:
    model = toy_decoder()
    model.graph.node.append(
        h.make_node(
            "GroupQueryAttention", ["q", "k", "v"], ["gqa"], name="gqa_0", domain="com.microsoft"
        )
    )
    model.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return model


REFUSED = {
    "no growing cache": (
        lambda: toy_decoder(past=False),
        NetworkError,
        "ONNX graph: expected a growing cache",
    ),
    "caches it cannot pair": (
        _unpaired,
        NetworkError,
        "cache output present.0.key: expected a concatenation of a graph input, "
        "got past_scaled (made by Mul node",
    ),
    "a dynamic head count": (
        lambda: toy_decoder(heads="heads"),
        ShapeError,
        "cache input past_key_values.0.key: expected a static head count and head size "
        "[B, N, P, H], got ['batch', 'heads', 'past', 4]",
    ),
    "an op the parser lacks": (
        lambda: _with_node("Mystery", "example.ops"),
        UnsupportedLayerError,
        "ONNX node odd_op (Mystery): expected a node",
    ),
    "GroupQueryAttention": (
        _gqa,
        UnsupportedLayerError,
        "ONNX node gqa_0 (com.microsoft.GroupQueryAttention): expected an op trt_kv rewrites",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_by_name(case, tmp_path):
    make, error, message = REFUSED[case]
    with pytest.raises(error) as raised:
        _load(_saved(make(), tmp_path))
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_build_refuses_with_one_line_and_writes_nothing(case, tmp_path):
    make, _, message = REFUSED[case]
    path = _saved(make(), tmp_path)
    out = run_cli("build", "--model", path, "--out", tmp_path / "engines", check=False)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()  # the parser's own log lines kept back
    assert line.startswith(f"trt-kv: error: {message}")
    assert not (tmp_path / "engines").exists()


def test_an_op_the_interpreter_lacks_is_refused_naming_the_onnx_node(tmp_path):
    model = toy_decoder()  # logits [B, S, V] -> [B, 1, S, V] -> LRN (a POOLING-like layer)
    g = model.graph
    g.node[-1].output[0] = "raw_logits"
    g.node.extend(
        [
            h.make_node("Unsqueeze", ["raw_logits", "i1"], ["logits4"]),
            h.make_node("LRN", ["logits4"], ["lrn"], name="odd_op", size=1),
            h.make_node("Squeeze", ["lrn", "i1"], ["logits"]),
        ]
    )
    d = _load(_saved(model, tmp_path))
    with pytest.raises(UnsupportedLayerError, match="ONNX node 'odd_op'"):
        InterpreterBackend(d.decoder)


def test_the_installed_parser_takes_tensor_scatter():
    """TensorRT-RTX 1.7.1 (and TensorRT >= 11.0) import ONNX's TensorScatter: preferred."""
    from trt_kv.onnx.parse import parser_update_op

    assert parser_update_op() == "TensorScatter"


def test_trt_kv_cache_update_rewrite_gives_the_same_ids(tmp_path):
    """The rewrite for a parser without TensorScatter: TensorRT's own TRT_KVCacheUpdate."""
    from trt_kv.onnx.parse import parse_decoder
    from trt_kv.onnx.rewrite import rewrite_decoder

    path = _saved(toy_decoder(), tmp_path)
    model, report = rewrite_decoder(onnx.load(path), 64, "TRT_KVCacheUpdate")
    assert report.update_op == "TRT_KVCacheUpdate"
    assert {n.op_type for n in model.graph.node} >= {"TRT_KVCacheUpdate"}
    assert "TensorScatter" not in {n.op_type for n in model.graph.node}
    net = parse_decoder(model.SerializeToString(), tmp_path, max_batch=3, max_step_tokens=8)
    got = generate(Session(InterpreterBackend(net)), PROMPTS, NEW_TOKENS).ids
    assert got == [ort_greedy(path, p, NEW_TOKENS) for p in PROMPTS]


def test_a_saved_rewritten_graph_loads_as_it_is(tmp_path):
    """The rewritten graph (kept next to an engine, opened in Netron) is a model itself: its
    report travels in its metadata and it is not rewritten twice."""
    d = _load(_saved(toy_decoder(), tmp_path))
    saved = d.save(tmp_path)
    assert saved.name == "toy.trt_kv.onnx"
    again = load_onnx_decoder(saved, max_seq_len=32, max_batch=3, max_step_tokens=8)
    assert again.report == d.report  # S_max 64, its own
    assert again.data == d.data
    got = generate(Session(InterpreterBackend(again.decoder)), PROMPTS, 8).ids
    assert got == generate(Session(InterpreterBackend(d.decoder)), PROMPTS, 8).ids


def test_a_chunked_prefill_gives_onnxruntimes_ids(tmp_path):
    """Steps of at most 3 tokens: the 7-token prompt is prefilled in three chunks, each
    writing its rows at its write index and masked by its positions."""
    path = _saved(toy_decoder(), tmp_path)
    d = load_onnx_decoder(path, max_seq_len=64, max_batch=3, max_step_tokens=3)
    got = generate(Session(InterpreterBackend(d.decoder)), PROMPTS, 8).ids
    assert got == [ort_greedy(path, p, 8) for p in PROMPTS]


def test_external_data_is_in_the_bytes_and_their_sha256(tmp_path):
    """A decoder saved with its weights in an external data file is read with them inline
    (an engine's recipe sha256 covers them: another weight in the data file, another
    sha256), and runs as the same decoder saved in one file."""
    path = tmp_path / "toy.onnx"
    onnx.save(toy_decoder(), path, save_as_external_data=True, location="w.bin", size_threshold=0)
    data_file = tmp_path / "w.bin"
    assert data_file.stat().st_size > 0
    external = _load(path)
    model = onnx.load_from_string(external.data)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)
    inline = _load(_saved(toy_decoder(), tmp_path, "inline.onnx"))
    got = generate(Session(InterpreterBackend(external.decoder)), PROMPTS, 8).ids
    assert got == generate(Session(InterpreterBackend(inline.decoder)), PROMPTS, 8).ids
    data = bytearray(data_file.read_bytes())
    data[0] ^= 0xFF
    data_file.write_bytes(bytes(data))
    assert _load(path).sha256 != external.sha256
