"""A TensorRT whose ONNX parser imports neither cache update (TensorRT 10.x before 11.0: no
``TensorScatter``, no ``TRT_KVCacheUpdate``): an ONNX model is refused naming both ops, with
nothing written. Only TensorRT-RTX (which imports both) is installed: the older parser is
its parser with those two ops taken out (:class:`ParserWithoutCacheUpdates`, put in place of
``trt.OnnxParser`` by ``monkeypatch`` and restored after each test), and trt_kv's own probe
(``parser_update_op``, its cached answer cleared around each test) runs on it."""

from __future__ import annotations

import onnx
import pytest

from tests.support.onnx_toy_decoders import toy_decoder
from trt_kv import _trt
from trt_kv.cli import main
from trt_kv.errors import UnsupportedLayerError
from trt_kv.onnx.decoder import load_onnx_decoder
from trt_kv.onnx.parse import parser_update_op

MISSING_IN_10 = ("TensorScatter", "TRT_KVCacheUpdate")
REFUSAL = (
    f"{_trt.trt.__name__} {_trt.trt.__version__}'s ONNX parser: expected one of the cache "
    "updates TensorScatter or TRT_KVCacheUpdate, got neither (TensorRT >= 11.0 or "
    "TensorRT-RTX imports them)"
)


class _Error:
    """A parser error as TensorRT's parser reports one (node name, operator, description)."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self.node = node

    def node_name(self) -> str:
        return self.node.name

    def node_operator(self) -> str:
        return self.node.op_type

    def desc(self) -> str:
        return f"No importer registered for op: {self.node.op_type}"


class ParserWithoutCacheUpdates:
    """The installed ``trt.OnnxParser`` without importers for :data:`MISSING_IN_10`: a graph
    holding one fails to parse, naming that node; any other graph is parsed by the real
    parser."""

    def __init__(self, network: object, logger: object, real: type) -> None:
        self.real, self.errors = real(network, logger), []

    def parse(self, model: bytes, path: str | None = None) -> bool:
        graph = onnx.load_model_from_string(model).graph
        self.errors = [_Error(n) for n in graph.node if n.op_type in MISSING_IN_10][:1]
        if self.errors:
            return False
        return self.real.parse(model) if path is None else self.real.parse(model, path)

    @property
    def num_errors(self) -> int:
        return len(self.errors) or self.real.num_errors

    def get_error(self, i: int) -> object:
        return self.errors[i] if self.errors else self.real.get_error(i)


@pytest.fixture
def older_parser(monkeypatch):
    """Calling it puts :class:`ParserWithoutCacheUpdates` in place of ``trt.OnnxParser``."""
    real = _trt.trt.OnnxParser

    def install() -> None:
        parser = lambda net, log: ParserWithoutCacheUpdates(net, log, real)  # noqa: E731
        monkeypatch.setattr(_trt.trt, "OnnxParser", parser)
        parser_update_op.cache_clear()

    yield install
    parser_update_op.cache_clear()  # the installed parser's answer again


def test_the_probe_refuses_a_parser_without_either_update(older_parser):
    older_parser()
    with pytest.raises(UnsupportedLayerError) as raised:
        parser_update_op()
    assert str(raised.value) == REFUSAL


def test_build_refuses_an_onnx_model_by_name_and_writes_nothing(older_parser, tmp_path, capsys):
    path = tmp_path / "toy.onnx"
    onnx.save(toy_decoder(), path)
    older_parser()
    out = tmp_path / "engines"
    assert main(["build", "--model", str(path), "--out", str(out), "-q"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"trt-kv: error: {REFUSAL}"]
    assert not out.exists()


def test_a_rewritten_file_is_refused_naming_its_update_node(older_parser, tmp_path):
    """A ``.trt_kv.onnx`` rewritten where the parser took TensorScatter loads as it is, not
    probed: the older parser names the node it lacks."""
    onnx.save(toy_decoder(), tmp_path / "toy.onnx")
    sizes = {"max_seq_len": 64, "max_batch": 3, "max_step_tokens": 8}
    rewritten = load_onnx_decoder(tmp_path / "toy.onnx", **sizes).save(tmp_path)
    older_parser()
    with pytest.raises(UnsupportedLayerError) as raised:
        load_onnx_decoder(rewritten, **sizes)
    assert str(raised.value).startswith(
        "ONNX node trt_kv.update.present.0.key (TensorScatter): expected a node "
        f"{_trt.trt.__name__} {_trt.trt.__version__}'s parser imports, got "
        "No importer registered for op: TensorScatter"
    )
