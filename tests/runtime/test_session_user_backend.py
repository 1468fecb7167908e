"""A user's own backend: Session needs ``storage``, ``max_step_tokens``, ``vocab_size`` and
``run``; ``long_rope_after`` is optional (absent = no longrope re-prefill)."""

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.errors import ArgumentError
from trt_kv.models.llama.reference_backend import llama_cache_aliases
from trt_kv.runtime import HostCaches, Sampler, Session, generate

V = 10


class CountingBackend:
    """A user's backend that predicts "the last token + 1 (mod 10)" and keeps its caches in
    trt_kv's host storage; it has no ``name`` and no ``long_rope_after``."""

    def __init__(self) -> None:
        self.storage = HostCaches(llama_cache_aliases(TINY_GQA, 16, "float32"), capacity=2)
        self.max_step_tokens = 4
        self.vocab_size = V

    def run(self, plan):
        last = plan.input_ids[np.arange(len(plan.counts)), plan.counts - 1]
        logits = np.zeros((len(last), V), np.float32)
        logits[np.arange(len(last)), (last + 1) % V] = 1.0
        return logits


def test_generate_runs_on_a_backend_without_long_rope_after():
    session = Session(CountingBackend())
    assert session.long_rope_after is None
    # prompt [2, 3] is 2 tokens (one step of 4), [7, 8, 9, 1, 5] 5 (a chunked prefill)
    out = generate(session, [[2, 3], [7, 8, 9, 1, 5]], 5, Sampler())
    assert out.ids == [[4, 5, 6, 7, 8], [6, 7, 8, 9, 0]]
    assert list(session.state.lengths) == [6, 9]  # the last new token is not fed


class NoVocabSize(CountingBackend):
    def __init__(self) -> None:
        super().__init__()
        del self.vocab_size


class NoRun:
    storage = None
    max_step_tokens = 4


def test_a_backend_missing_what_session_needs_is_refused_at_construction():
    with pytest.raises(ArgumentError, match=r"backend: expected a backend with storage, "):
        Session(NoVocabSize())
    with pytest.raises(ArgumentError, match=r"got NoVocabSize without vocab_size$"):
        Session(NoVocabSize())
    with pytest.raises(ArgumentError, match=r"got NoRun without vocab_size, run$"):
        Session(NoRun())
