"""GPT-2 (learned positions, LayerNorm with bias, fused Conv1D c_attn, gelu_new, MHA, tied
head): the NumPy reference against transformers, the built network (interpreter) against
the reference, and S_max past n_positions refused by name."""

import numpy as np
import pytest
import torch

from tests.support.gpt2_models import HF_CONFIG, PROMPTS, SIZES_ONLY, hf_greedy, save_gpt2
from trt_kv.builder import Routes
from trt_kv.checkpoints.hf import read_hf_folder
from trt_kv.errors import ConfigError, ShapeError
from trt_kv.models.gpt2 import GPT2Config, GPT2ReferenceBackend, build_gpt2_network, forward
from trt_kv.models.loading import load_model
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

S_MAX = 32


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    return save_gpt2(folder), folder


@pytest.fixture(scope="module")
def model(hf):
    return load_model(hf[1], progress=False)


def test_load_model_dispatches_a_gpt2_folder_to_gpt2(model):
    assert isinstance(model.config, GPT2Config)
    assert model.config.n_inner == 97 and model.config.head_dim == 12


def test_reference_logits_of_a_ragged_batch_match_transformers(hf, model):
    hf_model, _ = hf
    b, s = len(PROMPTS), max(map(len, PROMPTS))
    ids = np.zeros((b, s), np.int32)
    for k, p in enumerate(PROMPTS):
        ids[k, : len(p)] = p
    positions = np.tile(np.arange(s), (b, 1))
    shape = (b, model.config.n_head, S_MAX, model.config.head_dim)
    caches = [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(2)]
    counts = np.array([len(p) for p in PROMPTS], np.int32)
    logits = forward(
        model.config,
        model.weights.astype(np.float32),
        ids,
        positions,
        caches,
        np.zeros(b, np.int32),
        counts,
    )
    for k, p in enumerate(PROMPTS):
        with torch.no_grad():
            expected = hf_model(torch.tensor([p])).logits[0].numpy()
        np.testing.assert_allclose(logits[k, : len(p)], expected, rtol=1e-4, atol=1e-4)


def test_reference_gives_transformers_16_greedy_ids_of_a_ragged_batch(hf, model):
    backend = GPT2ReferenceBackend(model.config, model.weights, capacity=2, max_seq_len=S_MAX)
    ids = generate(Session(backend), PROMPTS, 16).ids
    assert ids == [hf_greedy(hf[0], p, 16) for p in PROMPTS]
    assert len(set(ids[0])) > 2  # the ids vary: the check can fail


ROUTES = [  # every attention route, with key_value_lengths where it applies (no RoPE here)
    Routes(attention=attention, key_value_lengths=lengths)
    for attention in ("attention_v2", "attention", "primitive")
    for lengths in (False, True)
    if not (lengths and attention == "primitive")
]


@pytest.mark.parametrize(
    "routes", ROUTES, ids=[f"{r.attention}{'-lengths' * r.key_value_lengths}" for r in ROUTES]
)
def test_interpreter_of_the_built_network_matches_the_reference(model, routes):
    net = build_gpt2_network(
        model.config,
        model.weights,
        max_seq_len=S_MAX,
        max_batch=2,
        max_step_tokens=8,
        dtype="float32",
        routes=routes,
    )
    inputs = {net.network.get_input(i).name for i in range(net.network.num_inputs)}
    assert ("key_value_lengths" in inputs) == routes.key_value_lengths
    ref = Session(GPT2ReferenceBackend(model.config, model.weights, capacity=2, max_seq_len=S_MAX))
    got = Session(InterpreterBackend(net))
    np.testing.assert_allclose(got.prefill(PROMPTS), ref.prefill(PROMPTS), atol=1e-4)
    for token in ([7, 9], [11, 13]):
        np.testing.assert_allclose(got.decode(token), ref.decode(token), atol=1e-4)
    ref.reset(), got.reset()
    assert generate(got, PROMPTS, 16).ids == generate(ref, PROMPTS, 16).ids


def test_interpreter_in_float16_gives_the_reference_ids(model):
    net = build_gpt2_network(model.config, model.weights, max_seq_len=S_MAX, max_batch=2)
    ref = GPT2ReferenceBackend(model.config, model.weights, capacity=2, max_seq_len=S_MAX)
    got = generate(Session(InterpreterBackend(net)), PROMPTS, 8).ids
    assert got == generate(Session(ref), PROMPTS, 8).ids


def test_max_seq_len_past_n_positions_is_refused_by_name(model):
    past = HF_CONFIG["n_positions"] + 1
    with pytest.raises(ShapeError, match=r"^max_seq_len: expected <= n_positions = 40 .*41$"):
        build_gpt2_network(model.config, model.weights, max_seq_len=past)
    with pytest.raises(ShapeError, match="n_positions = 40"):
        GPT2ReferenceBackend(model.config, model.weights, capacity=1, max_seq_len=past)


@pytest.mark.parametrize(
    "key, value",
    [("activation_function", "relu"), ("scale_attn_by_inverse_layer_idx", True)],
)
def test_a_switch_trt_kv_does_not_build_is_refused_by_name(hf, key, value):
    config = {**read_hf_folder(hf[1]).config, key: value}
    with pytest.raises(ConfigError, match=f"^config.{key}: expected"):
        GPT2Config.from_hf(config)


def test_a_missing_tensor_is_refused_by_name(hf):
    from trt_kv.models.gpt2 import gpt2_weights

    checkpoint = read_hf_folder(hf[1])
    tensors = dict(checkpoint.tensors)
    del tensors["transformer.h.1.attn.c_attn.weight"]
    config = GPT2Config.from_hf(checkpoint.config)
    with pytest.raises(ConfigError, match=r"^tensor h.1.attn.c_attn.weight: expected present"):
        gpt2_weights(tensors, config)


@pytest.mark.parametrize(
    "key, value, got",
    [
        ("layer_norm_epsilon", float("nan"), "nan"),  # transformers loads it: NaN logits
        ("layer_norm_epsilon", -1, "-1"),
        ("layer_norm_epsilon", -1.0, "-1.0"),
        ("layer_norm_epsilon", 0.0, "0.0"),
        ("layer_norm_epsilon", "1e-5", "'1e-5'"),  # transformers refuses the string
        ("n_inner", 0, "0"),  # transformers builds a zero-width MLP, refuses c_fc's shape
        ("n_inner", "128", "'128'"),
    ],
)
def test_a_config_value_transformers_does_not_build_is_refused_by_name(hf, key, value, got):
    config = {**read_hf_folder(hf[1]).config, key: value}
    kind = "a finite number > 0" if key == "layer_norm_epsilon" else "an integer > 0"
    with pytest.raises(ConfigError, match=rf"^config.{key}: expected {kind}, got {got}$"):
        GPT2Config.from_hf(config)


def test_n_inner_null_is_four_times_n_embd(hf):
    config = {**read_hf_folder(hf[1]).config, "n_inner": None}
    assert GPT2Config.from_hf(config).n_inner == 4 * HF_CONFIG["n_embd"]


@pytest.fixture(scope="module")
def as_saved(tmp_path_factory):
    """Sizes only (n_positions 48, eos_token_id GPT2Config's 50256 past V = 211)."""
    folder = tmp_path_factory.mktemp("gpt2_as_saved")
    return save_gpt2(folder, base=SIZES_ONLY, initializer_range=0.3), folder


def test_a_folder_as_saved_builds_and_generates_through_the_api(as_saved, capsys):
    hf_model, folder = as_saved
    model = load_model(folder, progress=False)
    assert model.checkpoint.eos_token_ids == ()  # 50256 dropped, said once on stderr
    assert capsys.readouterr().err.count("eos_token_id 50256 outside the vocabulary") == 1
    net = build_gpt2_network(model.config, model.weights, max_batch=2)  # no max_seq_len
    assert net.roles.max_seq_len == SIZES_ONLY["n_positions"]
    session = Session(InterpreterBackend(net))
    got = generate(session, PROMPTS, 6, eos_ids=model.checkpoint.eos_token_ids).ids
    assert got == [hf_greedy(hf_model, p, 6) for p in PROMPTS]


def test_build_model_engine_without_max_seq_len_takes_n_positions(as_saved, tmp_path):
    from trt_kv.engine.store import build_model_engine

    model = load_model(as_saved[1], progress=False)
    built = build_model_engine("g", model.config, model.weights, out_dir=tmp_path, max_batch=1)
    assert built.meta.roles.max_seq_len == SIZES_ONLY["n_positions"]
