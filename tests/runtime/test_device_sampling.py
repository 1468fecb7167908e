"""Sampling on the device (``device_top_k``): a network that ends in its own next-token
candidates (one TopK layer), the interpreter's TopK, and ``generate``'s ids through them equal
to the host-sampling path's, greedy and seeded top-k, on the interpreter.

The GPU backends (emulated TensorRT, with and without trt_kv's CUDA graph, and Polygraphy)
are in ``test_gpu_device_sampling.py``.
"""

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.builder.contract import _network_specs
from trt_kv.contract import DecoderRoles, check_roles
from trt_kv.errors import ArgumentError, NetworkError, ShapeError
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.runtime import Session, generate
from trt_kv.runtime.generate import device_sampling
from trt_kv.runtime.interpreter_backend import InterpreterBackend
from trt_kv.runtime.sampling import Sampler

SHAPES = {"max_seq_len": 24, "max_batch": 2, "max_step_tokens": 4, "dtype": "float32"}
PROMPTS = [[3, 4, 5], [9, 1]]
WEIGHTS = random_weights(TINY_GQA, seed=5, std=0.3)


def backend(k):
    return InterpreterBackend(build_llama_network(TINY_GQA, WEIGHTS, **SHAPES, device_top_k=k))


@pytest.fixture(scope="module")
def host():
    return backend(0)


@pytest.mark.parametrize(
    "k, sampler",
    [
        (1, lambda: Sampler()),
        (4, lambda: Sampler()),  # greedy among 4 candidates
        (4, lambda: Sampler(temperature=0.8, top_k=3, seed=3)),  # k > top_k: ties settle
        (8, lambda: Sampler(temperature=1.5, top_k=5, seed=11)),
    ],
)
def test_generate_on_the_device_path_gives_the_host_paths_ids(host, k, sampler):
    device = Session(backend(k))
    assert device_sampling(device, sampler(), 1.0)
    got = generate(device, PROMPTS, 12, sampler())
    want = generate(Session(host), PROMPTS, 12, sampler())
    assert got.ids == want.ids
    assert not device_sampling(Session(host), sampler(), 1.0)  # no candidates: logits


def test_the_candidates_are_the_best_logits_best_first():
    session = Session(backend(4))
    logits = session.prefill(PROMPTS)
    ids, values = session.backend.run_top_k(session.state.plan(range(2), [[7], [8]]))
    reference = Session(backend(0))
    reference.prefill(PROMPTS)
    full = reference.decode([7, 8])
    want = np.argsort(-full, axis=-1, kind="stable")[:, :4]
    assert ids.dtype == np.int32 and ids.tolist() == want.tolist()
    np.testing.assert_array_equal(values, np.take_along_axis(full, want, -1))
    assert logits.shape == (2, TINY_GQA.vocab_size)


def test_a_sampler_the_candidates_cannot_serve_takes_the_logits():
    session = Session(backend(4))
    assert not device_sampling(session, Sampler(temperature=1.0, top_k=4), 1.0)  # k = top_k
    assert not device_sampling(session, Sampler(temperature=1.0, top_k=5), 1.0)
    assert not device_sampling(session, Sampler(temperature=1.0, top_k=3, top_p=0.9), 1.0)
    assert not device_sampling(session, Sampler(temperature=1.0), 1.0)  # no top-k
    assert not device_sampling(session, Sampler(), 1.2)  # repetition penalty
    assert device_sampling(session, Sampler(), 1.0)


def test_decode_and_step_keep_returning_logits():
    session = Session(backend(1))
    session.prefill(PROMPTS)
    assert session.decode([1, 2]).shape == (2, TINY_GQA.vocab_size)
    ids, values = session.decode_top_k([3, 4])
    assert ids.shape == (2, 1) and values is None
    assert [session.length(s) for s in (0, 1)] == [5, 4]


def test_decode_top_k_on_a_network_without_candidates_is_refused(host):
    session = Session(host)
    session.prefill(PROMPTS)
    with pytest.raises(ArgumentError, match="device_top_k >= 1"):
        session.decode_top_k([1, 2])
    assert session.length(0) == 3


@pytest.mark.parametrize(
    "options, match",
    [
        ({"device_top_k": -1}, "device_top_k"),
        ({"device_top_k": TINY_GQA.vocab_size + 1}, "device_top_k"),
        ({"device_top_k": 2, "all_logits": True}, "0 with all_logits"),
        ({"device_top_k": 1.0}, "an integer"),
    ],
)
def test_a_bad_device_top_k_is_refused(options, match):
    with pytest.raises(ArgumentError, match=match):
        build_llama_network(TINY_GQA, WEIGHTS, **SHAPES, **options)


def test_a_network_built_with_no_device_top_k_picks_the_next_token_itself():
    """Issue 37: the default is 1 (a greedy GPU step downloads next_token [B], not the
    logits); a network of every position's logits (all_logits) has no sampling outputs."""
    assert build_llama_network(TINY_GQA, WEIGHTS, **SHAPES).roles.sampling_outputs() == (
        "next_token",
    )
    every = build_llama_network(TINY_GQA, WEIGHTS, **SHAPES, all_logits=True)
    assert every.roles.sampling_outputs() == ()


def test_the_roles_record_k_and_check_its_outputs():
    net = build_llama_network(TINY_GQA, WEIGHTS, **SHAPES, device_top_k=4)
    assert net.roles.device_top_k == 4
    assert DecoderRoles.from_json(net.roles.to_json()) == net.roles
    ins, outs = _network_specs(net.network)
    assert {n: outs[n] for n in ("top_ids", "top_logits")} == {
        "top_ids": ((-1, 4), "int32"),
        "top_logits": ((-1, 4), "float32"),
    }
    check_roles(net.roles, ins, outs)
    wrong = DecoderRoles.from_json({**net.roles.to_json(), "device_top_k": 2})
    with pytest.raises(ShapeError, match=r"top_ids.*\[B, 2\]"):
        check_roles(wrong, ins, outs)
    missing = {n: s for n, s in outs.items() if n != "top_logits"}
    with pytest.raises(NetworkError, match="top_logits"):
        check_roles(net.roles, ins, missing)
    greedy = build_llama_network(TINY_GQA, WEIGHTS, **SHAPES, device_top_k=1)
    assert greedy.roles.device_top_k == 1
    assert _network_specs(greedy.network)[1]["next_token"] == ((-1,), "int32")


class _LogitsOnly:
    """A user's backend with only the required members (no run_top_k), over a network
    that has candidates: generate must take the logits path."""

    def __init__(self, inner):
        self.storage, self.run = inner.storage, inner.run
        self.max_step_tokens, self.vocab_size = inner.max_step_tokens, inner.vocab_size
        self.device_top_k = inner.device_top_k  # claims k, but cannot run_top_k


def test_a_backend_without_run_top_k_keeps_the_logits_path(host):
    session = Session(_LogitsOnly(backend(1)))
    assert not device_sampling(session, Sampler(), 1.0)
    want = generate(Session(host), PROMPTS, 6).ids
    assert generate(session, PROMPTS, 6).ids == want


def test_gpt2_takes_the_same_option(tmp_path):
    from tests.support.gpt2_models import PROMPTS as GPT2_PROMPTS
    from tests.support.gpt2_models import save_gpt2
    from trt_kv.models.gpt2 import build_gpt2_network
    from trt_kv.models.loading import load_model

    save_gpt2(tmp_path)
    model = load_model(tmp_path, progress=False)
    shapes = {"dtype": "float32", "max_seq_len": 32, "max_batch": 3, "max_step_tokens": 8}

    def gpt2(k):
        return Session(
            InterpreterBackend(
                build_gpt2_network(model.config, model.weights, **shapes, device_top_k=k)
            )
        )

    device = gpt2(2)
    assert device.backend.device_top_k == 2 and device_sampling(device, Sampler(), 1.0)
    assert generate(device, GPT2_PROMPTS, 5).ids == generate(gpt2(0), GPT2_PROMPTS, 5).ids


def test_run_top_k_of_a_network_without_candidates_is_refused_before_running(host):
    session = Session(host)
    session.prefill(PROMPTS)
    before = {n: a.copy() for n, a in host.storage.window(0, 2).items()}
    with pytest.raises(ArgumentError, match="device_top_k >= 1, got 0"):
        host.run_top_k(session.state.plan(range(2), [[7], [8]]))
    for name, cache in host.storage.window(0, 2).items():
        np.testing.assert_array_equal(cache, before[name])


# -- ties at the top_k-th logit (review: the device's k candidates dropped tied tokens) ----
TIED = np.array([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0, -1.0, -2.0]], np.float32)


def _candidates(logits, k):
    """A network's k best, best first, ties to the lowest id (the interpreter's TopK)."""
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return ids.astype(np.int32), np.take_along_axis(logits, ids, -1)


def test_a_tie_that_ends_among_the_candidates_is_drawn_as_on_the_logits():
    # top_k = 2 keeps every token tied with the 2nd best: ids 0..3 (Hugging Face's rule)
    for seed in range(40):
        host = Sampler(temperature=1.0, top_k=2, seed=seed)(TIED)
        device = Sampler(temperature=1.0, top_k=2, seed=seed).choose(*_candidates(TIED, 5))
        assert device.tolist() == host.tolist()


def test_a_tie_that_reaches_the_last_candidate_is_left_to_the_logits():
    sampler = Sampler(temperature=1.0, top_k=2, seed=0)
    assert sampler.choose(*_candidates(TIED, 3)) is None  # ids 1, 2 tie: 3 may tie too
    assert sampler.choose(*_candidates(TIED, 4)) is None
    assert Sampler().choose(*_candidates(TIED, 3)).tolist() == [0]  # greedy: settled


@pytest.mark.parametrize("top_k", [3, 9])
def test_top_k_past_the_candidates_keeps_them_all_and_is_left_to_the_logits(top_k):
    # 2 candidates, top_k 3 (or past the vocabulary): min(top_k, 2) as TopKLogitsWarper's
    # min(top_k, V); every candidate is kept, the last one too, so tokens past them may be
    assert Sampler(temperature=1.0, top_k=top_k).choose(*_candidates(TIED, 2)) is None


class _TiedLogits:
    """A user backend whose every step's logits are TIED (a model with exact ties), with
    the optional ``run_top_k`` of ``device_top_k`` candidates a network would give."""

    name = "tied"
    device_top_k = 3

    def __init__(self):
        from trt_kv.builder.kv_cache import CacheAlias
        from trt_kv.runtime import HostCaches

        alias = CacheAlias("past", "present", (-1, 1, 16, 2), "float32")
        self.storage = HostCaches([alias], 2)
        self.max_step_tokens, self.vocab_size = 4, TIED.shape[1]
        self.logits_steps = 0

    def run(self, plan):
        self.logits_steps += 1
        return np.repeat(TIED, len(plan.counts), axis=0)

    def run_top_k(self, plan):
        return _candidates(np.repeat(TIED, len(plan.counts), axis=0), self.device_top_k)


def test_generate_takes_the_steps_logits_when_a_tie_reaches_past_the_candidates():
    device, host = _TiedLogits(), _TiedLogits()
    host.device_top_k = 0  # the logits path only
    sampler = lambda: Sampler(temperature=1.0, top_k=2, seed=7)  # noqa: E731
    got = generate(Session(device), [[1, 2], [3]], 6, sampler())
    want = generate(Session(host), [[1, 2], [3]], 6, sampler())
    assert got.ids == want.ids
    assert device.logits_steps == 1 + 5  # the prefill, then every step again for its logits


@pytest.mark.parametrize("k, run_top_k", [(3, False), (None, True), (True, True)])
def test_decode_top_k_of_a_backend_without_candidates_is_a_named_error(k, run_top_k):
    """``device_top_k`` without ``run_top_k`` was an AttributeError, ``None`` a TypeError."""
    backend = _TiedLogits()
    backend.device_top_k = k
    if not run_top_k:
        backend.run_top_k = None
    session = Session(backend)
    session.prefill([[1, 2]])
    with pytest.raises(ArgumentError, match="backend: expected one with run_top_k and device"):
        session.decode_top_k([3])
    assert session.length(0) == 2
