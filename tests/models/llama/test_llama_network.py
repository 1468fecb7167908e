"""The Llama TensorRT network, run layer by layer on the CPU interpreter, against the NumPy
reference model; its tensor names and cache aliases; and an ahead-of-time engine build of the
full SmolLM2-135M shape.

Tolerances (``atol = k * max|reference logit|``):
    float32 network: k = 1e-5. Both sides compute in float32 and differ only in the order
        of operations (measured: under 1e-6).
    float16 network: k = 2e-2. Weights, activations and the cache are float16, so every
        tensor boundary rounds to 11 significant bits (relative step 2**-11 ~ 5e-4); over two
        blocks and 9 steps the measured error is about 4e-3. 2e-2 leaves a 5x margin and
        stays far below a wrong wire (an error of the order of the scale itself).
"""

import dataclasses
import json
import re

import numpy as np
import pytest

from tests.support.tiny_models import SMALL_GQA
from trt_kv import FEATURES, dtypes
from trt_kv._trt import trt
from trt_kv.builder import cache_aliases, create_network
from trt_kv.engine.file import sidecar_path
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import ArgumentError, ShapeError
from trt_kv.interpreter import compile_network
from trt_kv.models.layers.graph import Graph
from trt_kv.models.llama import LlamaConfig, build_llama_network, random_weights
from trt_kv.models.llama.reference import empty_caches, forward
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.models.llama.rope_layers import add_rope, table_bytes
from trt_kv.runtime import Session, generate
from trt_kv.runtime.host_memory import available_host_bytes
from trt_kv.runtime.interpreter_backend import InterpreterBackend

SMALL = SMALL_GQA  # GQA 6:2, untied head; query width 6 * 8 = 48 = D
WEIGHTS = random_weights(SMALL, seed=0, std=0.2)  # std 0.2: logits of order 1, not uniform
S_MAX, MAX_BATCH, MAX_STEP = 32, 2, 8
PROMPTS = [[5, 17, 3, 88, 42, 7, 9], [60, 1, 33]]  # the second is right-padded to 7
DECODE_STEPS = 8
F32_TOL, F16_TOL = 1e-5, 2e-2


def _network(dtype="float32", all_logits=False):
    return build_llama_network(
        SMALL,
        WEIGHTS,
        max_seq_len=S_MAX,
        max_batch=MAX_BATCH,
        max_step_tokens=MAX_STEP,
        dtype=dtype,
        all_logits=all_logits,
    )


@pytest.fixture(scope="module")
def f32_network():
    return _network("float32")


def _reference_session():
    return Session(ReferenceBackend(SMALL, WEIGHTS, capacity=MAX_BATCH, max_seq_len=S_MAX))


def _assert_close(actual, expected, k):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=k * float(np.abs(expected).max()))


def _assert_teacher_forced_steps_close(net, k):
    """Prefill ``PROMPTS`` then 8 decode steps on both, feeding both the reference's greedy
    tokens (so one near-tie cannot make the two runs diverge); logits close at every step."""
    ours, ref = Session(InterpreterBackend(net)), _reference_session()
    got, want = ours.prefill(PROMPTS), ref.prefill(PROMPTS)
    _assert_close(got, want, k)
    for _ in range(DECODE_STEPS):
        tokens = np.argmax(want, axis=-1)
        got, want = ours.decode(tokens), ref.decode(tokens)
        _assert_close(got, want, k)


# -- numerics on the interpreter ------------------------------------------------------------


def test_float32_network_logits_match_reference_over_prefill_and_8_decode_steps(f32_network):
    _assert_teacher_forced_steps_close(f32_network, F32_TOL)


def test_float32_network_greedy_ids_equal_reference(f32_network):
    n = 1 + DECODE_STEPS  # one token from the prefill, one per decode step
    ours = generate(Session(InterpreterBackend(f32_network)), PROMPTS, n).ids
    ref = generate(_reference_session(), PROMPTS, n).ids
    assert [len(ids) for ids in ours] == [n, n]
    assert ours == ref


def test_float16_network_stays_within_float16_tolerance_of_float32_reference():
    _assert_teacher_forced_steps_close(_network("float16"), F16_TOL)


def test_all_logits_network_gives_the_reference_logits_of_every_position():
    plan = compile_network(_network("float32", all_logits=True).network)
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    s = int(lengths.max())
    ids = np.zeros((2, s), np.int32)
    for b, p in enumerate(PROMPTS):
        ids[b, : len(p)] = p
    positions = np.broadcast_to(np.arange(s, dtype=np.int64), (2, s)).copy()
    write_indices = np.zeros(2, np.int32)
    cache_shape = (2, SMALL.num_key_value_heads, S_MAX, SMALL.head_dim)
    feed = {
        "input_ids": ids,
        "position_ids": positions,
        "write_indices": write_indices,
    }
    for i in range(SMALL.num_hidden_layers):
        feed[f"past_key.{i}"] = np.zeros(cache_shape, np.float32)
        feed[f"past_value.{i}"] = np.zeros(cache_shape, np.float32)
    got = plan.run(feed)["logits"]
    want = forward(
        SMALL, WEIGHTS, ids, positions, empty_caches(SMALL, 2, S_MAX), write_indices, lengths
    )
    assert got.shape == (2, s, SMALL.vocab_size)
    for b, n in enumerate(lengths):  # padded positions are not specified
        _assert_close(got[b, :n], want[b, :n], F32_TOL)


# -- names and aliases ----------------------------------------------------------------------


def _signature(tensors):
    return {t.name: (tuple(t.shape), dtypes.name_of(t.dtype)) for t in tensors}


CACHE = ((-1, 2, S_MAX, 8), "float32")  # [B, N_kv, S_max, H]


def test_network_inputs_are_named_with_their_shapes_and_dtypes(f32_network):
    n = f32_network.network
    assert _signature(n.get_input(i) for i in range(n.num_inputs)) == {
        "input_ids": ((-1, -1), "int32"),
        "position_ids": ((-1, -1), "int64"),
        "write_indices": ((-1,), "int32"),
        "last_token_rows": ((-1,), "int32"),
        "past_key.0": CACHE,
        "past_value.0": CACHE,
        "past_key.1": CACHE,
        "past_value.1": CACHE,
    }


@pytest.mark.skipif(not FEATURES.dimension_names, reason="TensorRT without dimension names")
def test_every_input_names_its_batch_axis_and_token_inputs_their_step_axis(f32_network):
    # Equal names tell the builder every layer's cache has the batch of input_ids, so it
    # compiles the cache-reading kernels once for all layers (scripts/bench_build.py).
    n = f32_network.network
    names = {
        t.name: tuple(t.get_dimension_name(d) for d in range(len(t.shape)))
        for t in map(n.get_input, range(n.num_inputs))
    }
    assert names == {
        "input_ids": ("B", "S"),
        "position_ids": ("B", "S"),
        "write_indices": ("B",),
        "last_token_rows": ("B",),
        **{f"past_{kv}.{i}": ("B", None, None, None) for kv in ("key", "value") for i in (0, 1)},
    }


def test_network_outputs_are_last_token_logits_next_token_and_present_caches(f32_network):
    n = f32_network.network
    assert _signature(n.get_output(i) for i in range(n.num_outputs)) == {
        "logits": ((-1, 97), "float32"),
        "next_token": ((-1,), "int32"),  # device_top_k 1, the default
        "present_key.0": CACHE,
        "present_value.0": CACHE,
        "present_key.1": CACHE,
        "present_value.1": CACHE,
    }


def test_each_present_cache_aliases_its_past_cache(f32_network):
    pairs = [(a.input, a.output) for a in cache_aliases(f32_network.network)]
    assert pairs == [
        ("past_key.0", "present_key.0"),
        ("past_value.0", "present_value.0"),
        ("past_key.1", "present_key.1"),
        ("past_value.1", "present_value.1"),
    ]


def test_all_logits_network_has_no_last_token_rows_input():
    n = _network("float32", all_logits=True).network
    assert "last_token_rows" not in {n.get_input(i).name for i in range(n.num_inputs)}


def test_float16_network_caches_are_float16():
    assert {a.dtype for a in cache_aliases(_network("float16").network)} == {"float16"}


# -- build limits and the full-size engine --------------------------------------------------


def test_max_step_tokens_longer_than_max_seq_len_raises():
    with pytest.raises(ShapeError, match=re.escape("max_step_tokens")):
        build_llama_network(SMALL, WEIGHTS, max_seq_len=16, max_step_tokens=17)


def test_smollm2_135m_float16_network_builds_an_engine_with_its_sidecar(tmp_path):
    config = LlamaConfig()  # SmolLM2-135M: 30 layers, D=576, 9:3 heads of 64, V=49152
    built = build_model_engine(
        "smollm2-135m",
        config,
        random_weights(config),
        out_dir=tmp_path,
        dtype="float16",
        max_seq_len=128,
        max_batch=8,
        max_step_tokens=64,
    )
    sidecar = json.loads(sidecar_path(built.path).read_text())
    assert sidecar["bytes"] == built.path.stat().st_size > 0
    assert sidecar["build_seconds"] > 0
    assert len(sidecar["alias_pairs"]) == 2 * 30
    assert sidecar["alias_pairs"][0] == {
        "input": "past_key.0",
        "output": "present_key.0",
        "shape": [-1, 3, 128, 64],
        "dtype": "float16",
    }
    assert sidecar["metadata"]["config"] == config.to_json()


OTHER_SHAPE = random_weights(dataclasses.replace(SMALL, hidden_size=24), seed=0)


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        (
            {"max_seq_len": 0},
            ArgumentError,
            r"max_seq_len: expected an integer in \[1, 2147483647\], got 0",
        ),
        (
            {"max_seq_len": 2**31},  # write_indices and key_value_lengths are int32
            ArgumentError,
            r"max_seq_len: expected an integer in \[1, 2147483647\], got 2147483648",
        ),
        ({"max_batch": 0}, ArgumentError, "max_batch: expected an integer >= 1, got 0"),
        ({"max_step_tokens": 0}, ArgumentError, "max_step_tokens: expected an integer >= 1, got 0"),
        ({"max_batch": 2.0}, ArgumentError, "max_batch: expected an integer >= 1, got 2.0"),
        ({"weights": None}, ArgumentError, "weights: expected a LlamaWeights, got NoneType"),
        (
            {"routes": "primitive"},
            ArgumentError,
            "routes: expected a Routes or None, got 'primitive'",
        ),
        (
            {"weights": OTHER_SHAPE},
            ShapeError,
            r"model.embed_tokens.weight: expected shape \(97, 48\), got \(97, 24\)",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name_before_any_layer(kwargs, exc, message):
    """Each was a TensorRT RuntimeError, an AttributeError or a network built with an empty
    profile."""
    args = {"weights": WEIGHTS, "max_seq_len": S_MAX, "max_batch": 1, **kwargs}
    with pytest.raises(exc, match=f"^{message}$"):
        build_llama_network(SMALL, **args)


def test_max_step_tokens_defaults_to_128_or_s_max_when_smaller():
    """A short cache does not need a step width the caller never asked for."""
    assert build_llama_network(SMALL, WEIGHTS, max_seq_len=16, max_batch=1).max_step_tokens == 16
    net = build_llama_network(SMALL, WEIGHTS, max_seq_len=200, max_batch=1, dtype="float32")
    assert net.max_step_tokens == 128


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((SMALL, -1), "seed: expected an integer >= 0, got -1"),
        ((SMALL, 0, -0.1), r"std: expected a finite number >= 0.0, got -0.1"),
        ((None,), "config: expected a LlamaConfig, got NoneType"),
    ],
)
def test_random_weights_refuse_bad_arguments_by_name(args, message):
    with pytest.raises(ArgumentError, match=f"^{message}$"):
        random_weights(*args)


@pytest.mark.skipif(available_host_bytes() is None, reason="no MemAvailable (not Linux)")
def test_max_seq_len_whose_rope_tables_exceed_host_memory_is_refused_before_building():
    """It was ~76 s of building then TensorRT out of memory (or NumPy's MemoryError as a
    traceback): cos and sin [S_max, H=8] float32, in the network and again in the engine, are
    (2^31 - 1) * 8 * 4 * 4 bytes = 256 GiB."""
    with pytest.raises(ArgumentError) as err:
        build_llama_network(SMALL, WEIGHTS, max_seq_len=2**31 - 1)
    assert re.fullmatch(
        r"max_seq_len: expected an S_max whose RoPE tables fit host memory, [\d.]+ GiB "
        r"available, got 2147483647 \(tables \[S_max, H\] of 256.0 GiB\)",
        str(err.value),
    ), err.value
    assert table_bytes(SMALL, 1000) == 2 * 2 * 1000 * 8 * 4


def test_rope_tables_numpy_cannot_allocate_are_an_argument_error_naming_max_seq_len():
    """The check before building can pass and NumPy still fail (another process took the
    memory): 2^40 positions (4 TiB of float32 angles) fail to allocate at once."""
    _, network = create_network()
    g = Graph(network, "float32")
    positions = network.add_input("position_ids", trt.int64, (-1, -1))
    with pytest.raises(
        ArgumentError,
        match=r"max_seq_len: expected an S_max whose RoPE tables "
        r"fit host memory, got 1099511627776 \(tables",
    ) as err:
        add_rope(g, "elementwise", SMALL, positions, 2**40)
    assert isinstance(err.value.__cause__, MemoryError)
