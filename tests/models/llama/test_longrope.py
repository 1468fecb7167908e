"""Phi-3 ``longrope`` past ``original_max_position_embeddings``: short and long tables.

A random-weight ``Phi3ForCausalLM`` (original length 32, long factors far from the short
ones, so the switch changes the ids) saved with ``save_pretrained`` is the oracle:

- Hugging Face's forward with a cache (``model(ids, past_key_values=...)``) picks the table per
  forward from ``max(position_ids) + 1``; cached keys keep the rotation they were written
  with. trt_kv's ``Session`` steps do the same, per sequence.
- Hugging Face's Phi-3 ``generate`` drops the cache when a sequence first passes the original
  length and recomputes it with the long table; trt_kv's ``generate`` prefills that sequence
  again, so each sequence gets the ids Hugging Face gives it alone.

Then the built network, in both RoPE routes, on the interpreter (and a TensorRT-RTX engine on
the emulated GPU backends) against the reference.
"""

import numpy as np
import pytest
import torch
import transformers

from tests.support.hf_models import greedy_ids, save_random_model
from trt_kv.builder import Routes
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import ArgumentError, DTypeError, ShapeError
from trt_kv.models.llama import LlamaConfig, build_llama_network, load_hf_weights
from trt_kv.models.llama.network import ROPE_LENGTHS
from trt_kv.models.llama.reference import empty_caches, forward
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

ORIGINAL, S_MAX, NEW = 32, 64, 16
RNG = np.random.default_rng(7)
P40, P28 = RNG.integers(3, 91, 40).tolist(), RNG.integers(3, 91, 28).tolist()
P32 = RNG.integers(3, 91, ORIGINAL).tolist()  # crosses at its first decode step
# past the original length in prefill (40), at the first decode step (32), at the 5th (28)
PROMPTS = [P40, P32, P28]
TOL = 1e-4  # times max |logit|, float32 on both sides (as the other oracle tests)

HF_ARGS = dict(
    num_hidden_layers=2,
    initializer_range=0.2,
    vocab_size=91,
    hidden_size=32,
    intermediate_size=40,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,  # attention factor sqrt(1 + ln(128 / 32) / ln(32)), both tables
    original_max_position_embeddings=ORIGINAL,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.5, 2.5, 4.0],
        "long_factor": [3.0, 6.0, 12.0, 24.0],
        "original_max_position_embeddings": ORIGINAL,
    },
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """``(hf_model, config, weights)`` read back from ``save_pretrained``."""
    folder = tmp_path_factory.mktemp("phi3_longrope")
    model = save_random_model(
        transformers.Phi3ForCausalLM, transformers.Phi3Config(**HF_ARGS), folder
    )
    config = LlamaConfig.from_hf(folder)
    return model, config, load_hf_weights(folder, config)


@pytest.fixture(scope="module")
def reference_ids(phi3):
    _, config, weights = phi3
    session = Session(ReferenceBackend(config, weights, capacity=3, max_seq_len=S_MAX))
    return generate(session, PROMPTS, NEW).ids


def _close(ours, theirs):
    theirs = np.asarray(theirs)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOL * np.abs(theirs).max())


def _hf_logits(model, prompt):
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].numpy()  # [S, V]


@pytest.mark.parametrize(
    "rope_lengths, error, message",
    [
        (np.array([[40]]), ShapeError, r"rope_lengths: expected shape \[1\], got \[1, 1\]"),
        (np.array([40, 40]), ShapeError, r"rope_lengths: expected shape \[1\], got \[2\]"),
        (np.array([40.0]), DTypeError, r"rope_lengths: expected an integer dtype, got float64"),
        (np.array([-1]), ArgumentError, r"rope_lengths: expected values >= 0, got \[-1\]"),
    ],
)
def test_reference_forward_refuses_bad_rope_lengths_before_the_caches_change(
    phi3, rope_lengths, error, message
):
    _, config, weights = phi3
    caches = empty_caches(config, 1, S_MAX)
    ids, positions = np.array([P40[:4]]), np.arange(4)[None]
    with pytest.raises(error, match=message):
        forward(config, weights, ids, positions, caches, np.zeros(1, np.int32), np.array([4]),
                rope_lengths=rope_lengths)  # fmt: skip
    assert all(not k.any() and not v.any() for k, v in caches)


def test_prefill_past_the_original_length_takes_the_long_table_for_every_token(phi3):
    model, config, weights = phi3
    expected = _hf_logits(model, P40)
    caches = empty_caches(config, 1, S_MAX)
    positions = np.arange(40)[None]
    logits = forward(
        config, weights, np.array([P40]), positions, caches, np.zeros(1, np.int32), np.array([40])
    )[0]
    _close(logits, expected)
    # the same step on the short table (rope_lengths at or below 32) is far from Hugging Face
    short = forward(
        config,
        weights,
        np.array([P40]),
        positions,
        empty_caches(config, 1, S_MAX),
        np.zeros(1, np.int32),
        np.array([40]),
        rope_lengths=np.array([ORIGINAL]),
    )[0]
    assert np.abs(short - expected).max() > 100 * TOL * np.abs(expected).max()


def test_session_steps_across_the_original_length_match_hugging_face_forward_with_a_cache(phi3):
    """Prefill 28 tokens, then 7 decode steps to 35: lengths up to 32 on the short table,
    33-35 on the long one for the new token only; the keys of positions 0-31 stay in the
    cache as written (on both sides)."""
    model, config, weights = phi3
    cache = transformers.DynamicCache(config=model.config)
    session = Session(ReferenceBackend(config, weights, capacity=1, max_seq_len=S_MAX))
    ids = [P28]
    for _ in range(8):
        with torch.no_grad():
            theirs = model(torch.tensor(ids), past_key_values=cache, use_cache=True).logits[0, -1]
        ours = session.step(ids)[0]
        _close(ours, theirs.numpy())
        ids = [[int(theirs.argmax())]]
    assert session.length(0) == 35


def test_generate_matches_hugging_face_generate_for_each_sequence_of_a_ragged_batch(
    phi3, reference_ids
):
    """Prompts of 40, 32 and 28 tokens in one batch; Hugging Face's ids of each alone."""
    model, _, _ = phi3
    assert reference_ids == greedy_ids(model, PROMPTS, NEW)


def test_chunked_prefill_takes_the_table_of_the_whole_prompt(phi3):
    """40 tokens in chunks of 16, 16, 8: the first two end below 32, yet take the long table
    (the prompt's final length picks it), as one Hugging Face forward of the prompt does."""
    model, config, weights = phi3
    session = Session(
        ReferenceBackend(config, weights, capacity=1, max_seq_len=S_MAX, max_step_tokens=16)
    )
    _close(session.prefill([P40])[0], _hf_logits(model, P40)[-1])


def _hf_batched(model, prompts, n):
    """Hugging Face ``generate`` on one left-padded batch."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]
    out = model.generate(
        ids,
        attention_mask=mask.long(),
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[:, width:].tolist()


def test_ragged_batch_agrees_with_hugging_face_batched_when_every_sequence_is_long(phi3):
    model, config, weights = phi3
    prompts = [P40, P40[:35]]
    session = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    assert generate(session, prompts, NEW).ids == _hf_batched(model, prompts, NEW)


def test_a_short_sequence_beside_a_long_one_keeps_its_own_table_unlike_hugging_face_batched(
    phi3,
):
    """Hugging Face picks the table for the whole batch from its longest row: the 20-token
    prompt beside a 40-token one is rotated by the long table and gets other ids than alone.
    trt_kv picks per sequence: the ids of each prompt alone."""
    model, config, weights = phi3
    prompts = [P40, P28[:20]]
    session = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    alone = greedy_ids(model, prompts, NEW)
    assert generate(session, prompts, NEW).ids == alone
    assert _hf_batched(model, prompts, NEW)[1] != alone[1]


@pytest.mark.parametrize("rope", ["rotary_layer", "elementwise"])
@pytest.mark.parametrize("max_step", [48, 16], ids=["one-step-prefill", "chunked-prefill"])
def test_each_rope_route_on_the_interpreter_equals_the_reference(
    phi3, reference_ids, rope, max_step
):
    _, config, weights = phi3
    net = build_llama_network(
        config,
        weights,
        max_seq_len=S_MAX,
        max_batch=3,
        max_step_tokens=max_step,
        dtype="float32",
        routes=Routes(rope=rope),
    )
    reference = Session(
        ReferenceBackend(config, weights, capacity=3, max_seq_len=S_MAX, max_step_tokens=max_step)
    )
    _close(Session(InterpreterBackend(net)).prefill(PROMPTS), reference.prefill(PROMPTS))
    assert generate(Session(InterpreterBackend(net)), PROMPTS, NEW).ids == reference_ids


@pytest.mark.parametrize(("dtype", "tol"), [("float16", 40 * 2**-11), ("bfloat16", 40 * 2**-8)])
def test_half_precision_networks_on_the_interpreter_follow_the_reference(phi3, dtype, tol):
    """float16 / bfloat16 networks (the rope_lengths input and both tables included) against
    the float32 reference: a ragged prefill (one prompt past the original length) and decode
    steps that carry the shorter ones across it. Tolerance: 40 units of the dtype's relative
    rounding times max |logit| (measured worst: float16 0.9%, bfloat16 6.1%, ~20 units each:
    every tensor of this 2-layer model with weights of scale 0.2 rounds)."""
    _, config, weights = phi3
    net = build_llama_network(
        config, weights, max_seq_len=S_MAX, max_batch=3, max_step_tokens=48, dtype=dtype
    )
    assert ROPE_LENGTHS in {net.network.get_input(i).name for i in range(net.network.num_inputs)}
    ours = Session(InterpreterBackend(net))
    reference = Session(ReferenceBackend(config, weights, capacity=3, max_seq_len=S_MAX))
    want = reference.prefill(PROMPTS)
    got = ours.prefill(PROMPTS)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    for _ in range(6):  # P28 (length 28) reaches the original length 32 at the 5th step
        tokens = want.argmax(-1)
        want, got = reference.decode(tokens), ours.decode(tokens)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())


def test_the_long_table_costs_an_input_only_past_the_original_length(phi3):
    _, config, weights = phi3

    def inputs(s_max):
        net = build_llama_network(config, weights, max_seq_len=s_max, max_step_tokens=8)
        return {net.network.get_input(i).name for i in range(net.network.num_inputs)}

    assert ROPE_LENGTHS in inputs(ORIGINAL + 1)
    assert ROPE_LENGTHS not in inputs(ORIGINAL)


@pytest.fixture(scope="module")
def engine(phi3, tmp_path_factory):
    """A float32 TensorRT-RTX engine (chunked prefill: steps of 16), built inside the first
    gpu test (on the emulated device here, so it can be deserialized there)."""
    _, config, weights = phi3
    return build_model_engine(
        "phi3-longrope",
        config,
        weights,
        dtype="float32",
        max_seq_len=S_MAX,
        max_batch=3,
        max_step_tokens=16,
        out_dir=tmp_path_factory.mktemp("engines"),
    ).path


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["tensorrt", "tensorrt-graph", "polygraphy"])
def test_engine_on_the_gpu_backends_generates_the_reference_ids(engine, reference_ids, backend):
    """The rope_lengths input is bound like every step input, CUDA graphs included."""
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    if backend == "polygraphy":
        runner = PolygraphyBackend(engine)
    else:
        runner = TrtBackend(engine, cuda_graph=backend == "tensorrt-graph")
    assert generate(Session(runner), PROMPTS, NEW).ids == reference_ids


def test_inspect_names_the_rope_lengths_input_and_the_length_past_which_it_switches(phi3, tmp_path):
    """What a user driving the engine from their own loop reads off ``trt-kv inspect``."""
    from trt_kv.cli.inspect import format_report, report

    _, config, weights = phi3
    built = build_model_engine(
        "phi3-longrope",
        config,
        weights,
        dtype="float32",
        max_seq_len=S_MAX,
        max_batch=2,
        max_step_tokens=8,
        out_dir=tmp_path,
    )
    text = format_report(report(built.path))
    assert "model_type=phi3" in text
    assert "longrope: a sequence whose rope_lengths > 32 reads the long table" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if " input " in line}
    assert rows[ROPE_LENGTHS][:3] == ["input", "int32", "[-1]"]
