"""A network's constant layers point at NumPy arrays (``trt.Weights`` holds a pointer, read
when an engine is built or the interpreter compiles the network): those arrays live exactly
as long as the network object, whatever else the caller drops."""

import gc
import weakref

import numpy as np

from tests.support.tiny_models import TINY_GQA
from trt_kv._trt import trt
from trt_kv.interpreter.weights import constant_array
from trt_kv.models.llama import build_llama_network, random_weights

WEIGHTS = random_weights(TINY_GQA, seed=3, std=0.3)


def build(weights=WEIGHTS):
    return build_llama_network(
        TINY_GQA, weights, max_seq_len=16, max_batch=2, max_step_tokens=4, dtype="float32"
    )


def constants(network):
    """Every constant layer's value (copied), in layer order."""
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.CONSTANT:
            layer.__class__ = trt.IConstantLayer
            out.append(constant_array(layer, np.dtype(np.float32)).copy())
    return out


def test_constants_survive_dropping_the_llama_network_around_the_network():
    net = build()
    network = net.network
    before = constants(network)
    del net
    gc.collect()
    # freed memory would be reused by these (it was: 10 of 30 constants changed)
    junk = [np.full(a.shape, 7.0, a.dtype) for a in before for _ in range(3)]
    after = constants(network)
    assert len(after) == len(before) == 30 and junk
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    embed = next(a for a in after if a.shape == (64, 32))
    np.testing.assert_array_equal(embed, WEIGHTS.embed)


def test_the_arrays_are_released_with_the_network():
    weights = random_weights(TINY_GQA, seed=4, std=0.3)  # some arrays are kept as they are
    net = build(weights)
    held = [weakref.ref(a) for a in net.keep]
    assert held and all(r() is not None for r in held)
    del net, weights
    gc.collect()
    assert all(r() is None for r in held)
