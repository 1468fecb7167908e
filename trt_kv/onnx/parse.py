"""A rewritten ONNX decoder parsed by TensorRT's ``OnnxParser`` into a strongly typed network
with its decoder roles: what the interpreter runs and the engine store builds."""

from __future__ import annotations

from pathlib import Path

from trt_kv._trt import logger, trt
from trt_kv.builder.contract import DecoderNetwork, decoder_profiles, decoder_roles
from trt_kv.builder.engine import create_network
from trt_kv.errors import UnsupportedLayerError, mismatch


def parse_decoder(
    model: bytes, folder: Path, *, max_batch: int, max_step_tokens: int
) -> DecoderNetwork:
    """The network of the serialized ONNX ``model`` (a rewritten decoder,
    :func:`~trt_kv.onnx.rewrite.rewrite_decoder`; external data files in ``folder``), parsed
    into a strongly typed network with the two decoder profiles
    (B <= ``max_batch``, S <= ``max_step_tokens``) and its checked roles.

    Raises:
        UnsupportedLayerError: a node the installed TensorRT's parser does not import, named
            with its op (``TensorScatter`` needs a parser of TensorRT >= 11.0 or TensorRT-RTX).
        NetworkError, DTypeError, ShapeError: a network that breaks the decoder contract
            (:func:`~trt_kv.builder.contract.decoder_roles`).
        ArgumentError: ``max_batch`` or ``max_step_tokens`` not an integer >= 1.
    """
    builder, network = create_network()
    parser = trt.OnnxParser(network, logger())
    if not parser.parse(model, str(folder)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        first = errors[0] if errors else None
        where = (
            f"ONNX node {first.node_name()} ({first.node_operator()})" if first else "ONNX graph"
        )
        desc = first.desc() if first else "no error reported"
        raise UnsupportedLayerError(
            mismatch(where, f"a node {trt.__name__} {trt.__version__}'s parser imports", "", desc)
        )
    profiles = decoder_profiles(network, max_batch=max_batch, max_step_tokens=max_step_tokens)
    roles = decoder_roles(network, profiles)
    return DecoderNetwork(builder, network, profiles, roles, keep=parser)
