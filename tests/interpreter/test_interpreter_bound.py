"""A decode step bound once (trt_kv/interpreter/bound.py): buffers held between runs, the
block products, residual add + RMSNorm and SwiGLU called with their arguments taken once.

Oracle: the same plan's unbound runs. A plan binds at the second run in a row of one feed
signature (shapes, dtypes, the caches' identities); fed its caches alternately from two
copies, a plan never binds. The two run the same kernels and helper calls, so their logits
and caches agree bit for bit, through a prefill between decode steps and a refused write.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from tests.support.tiny_models import TINY_HF_CONFIG
from trt_kv.errors import CacheOverflowError
from trt_kv.interpreter import blocks, bound, compile_network
from trt_kv.models.llama import LlamaConfig, build_llama_network, random_weights

S_MAX = 16
CONFIG = LlamaConfig.from_hf(TINY_HF_CONFIG)


@pytest.fixture(scope="module")
def network() -> object:
    weights = random_weights(CONFIG, seed=5)
    return build_llama_network(
        CONFIG, weights, max_seq_len=S_MAX, max_batch=1, max_step_tokens=4, dtype="float16",
        weight_format="int4",
    )  # fmt: skip


def _feed(caches: dict, ids: list[int], start: int) -> dict:
    s = len(ids)
    return dict(
        caches, input_ids=np.array([ids], np.int32),
        position_ids=np.arange(start, start + s, dtype=np.int64)[None],
        write_indices=np.array([start], np.int32), last_token_rows=np.array([s - 1], np.int32),
    )  # fmt: skip


class Runner:
    """A plan with its caches: one set (it binds), or two copies taken in turn (it never does)."""

    def __init__(self, network: object, alternate: bool) -> None:
        self.plan = compile_network(network.network, wide_float16_caches=True)
        shape = (1, CONFIG.num_key_value_heads, S_MAX, CONFIG.head_dim)
        names = [n for n in self.plan.input_names if n.startswith("past_")]
        self.sets = [{n: np.zeros(shape, np.float32) for n in names} for _ in range(1 + alternate)]
        self.turn = 0

    @property
    def caches(self) -> dict:
        return self.sets[self.turn]

    def step(self, ids: list[int], start: int) -> np.ndarray:
        logits = self.plan.run(_feed(self.caches, ids, start))["logits"]
        if len(self.sets) == 2:  # the other copy holds the same caches for the next run
            for name, a in self.caches.items():
                np.copyto(self.sets[1 - self.turn][name], a)
            self.turn = 1 - self.turn
        return logits


def _pair(network: object) -> tuple[Runner, Runner]:
    require_compiled_helper()
    return Runner(network, alternate=False), Runner(network, alternate=True)


def _same(a: Runner, b: Runner) -> None:
    for name in a.caches:
        np.testing.assert_array_equal(a.caches[name], b.caches[name], err_msg=name)


def test_decode_steps_bound_once_give_the_unbound_plans_bits(network):
    fast, plain = _pair(network)
    made, runs, steps = bound.COUNTS["bound"], bound.COUNTS["runs"], bound.COUNTS["steps"]
    rng = np.random.default_rng(3)
    prompt = rng.integers(1, CONFIG.vocab_size, 4).tolist()
    np.testing.assert_array_equal(fast.step(prompt, 0), plain.step(prompt, 0))
    assert bound.COUNTS["bound"] == made
    products = blocks.COUNTS.copy()
    for i in range(6):
        token = [int(rng.integers(1, CONFIG.vocab_size))]
        np.testing.assert_array_equal(fast.step(token, 4 + i), plain.step(token, 4 + i))
    _same(fast, plain)
    assert bound.COUNTS["bound"] == made + 1  # the second decode step bound the program
    # a layer's 4 block products, 2 residual add + RMSNorms, SwiGLU and attention block; the
    # first RMSNorm (no residual yet), the head (tied to the float16 embedding), ... unbound
    assert bound.COUNTS["steps"] == steps + 8 * CONFIG.num_hidden_layers
    assert bound.COUNTS["runs"] == runs + 4  # and the four after it ran it
    assert sum((blocks.COUNTS - products).values()) > 0  # block products ran


def test_a_prefill_between_decode_steps_runs_unbound_and_the_program_stays(network):
    fast, plain = _pair(network)
    rng = np.random.default_rng(4)
    at = 0
    for ids in ([5, 6, 7], [8], [9], [10, 11, 12, 13], [14], [15], [16]):
        np.testing.assert_array_equal(fast.step(ids, at), plain.step(ids, at))
        at += len(ids)
    _same(fast, plain)
    runs = bound.COUNTS["runs"]
    token = [int(rng.integers(1, CONFIG.vocab_size))]
    np.testing.assert_array_equal(fast.step(token, at), plain.step(token, at))
    assert bound.COUNTS["runs"] == runs + 1


def test_a_refused_write_on_a_bound_plan_changes_nothing_and_decoding_goes_on(network):
    fast, plain = _pair(network)
    for i, ids in enumerate(([1, 2, 3, 4], [5], [6], [7])):
        at = 0 if i == 0 else 3 + i
        np.testing.assert_array_equal(fast.step(ids, at), plain.step(ids, at))
    before = {name: a.copy() for name, a in fast.caches.items()}
    feed = _feed(fast.caches, [8], 7) | {"write_indices": np.array([S_MAX], np.int32)}
    with pytest.raises(CacheOverflowError):
        fast.plan.run(feed)
    for name, a in fast.caches.items():
        np.testing.assert_array_equal(a, before[name], err_msg=name)
    for at in (7, 8):
        np.testing.assert_array_equal(fast.step([9], at), plain.step([9], at))
    _same(fast, plain)


def test_two_threads_decoding_on_one_plan_get_their_own_bits(network):
    """One thread's decode steps run bound while another's run on the same plan (unbound, or
    bound in turn): each gets the logits and caches of a plan of its own."""
    require_compiled_helper()
    shared = compile_network(network.network, wide_float16_caches=True)
    rng = np.random.default_rng(6)
    tokens = [rng.integers(1, CONFIG.vocab_size, 12).tolist() for _ in range(2)]
    results: dict[int, list] = {}

    def decode(who: int, runner: Runner) -> None:
        ids = tokens[who]
        out = [runner.step(ids[:4], 0)]
        out += [runner.step([t], 4 + i) for i, t in enumerate(ids[4:])]
        results[who] = [*out, runner.caches]

    runners = [Runner(network, alternate=False) for _ in range(2)]
    for r in runners:
        r.plan = shared
    threads = [threading.Thread(target=decode, args=(i, r)) for i, r in enumerate(runners)]
    interval, runs = sys.getswitchinterval(), bound.COUNTS["runs"]
    sys.setswitchinterval(1e-5)  # the threads take turns within a run, not a run each
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert bound.COUNTS["runs"] > runs  # some of the runs were bound
    for who in range(2):
        alone = Runner(network, alternate=True)
        expected = [alone.step(tokens[who][:4], 0)]
        expected += [alone.step([t], 4 + i) for i, t in enumerate(tokens[who][4:])]
        for got, want in zip(results[who][:-1], expected):
            np.testing.assert_array_equal(got, want)
        for name, a in results[who][-1].items():
            np.testing.assert_array_equal(a, alone.caches[name], err_msg=name)
