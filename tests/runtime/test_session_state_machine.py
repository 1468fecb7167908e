"""Stateful property test of the session API: random prefill / step / decode / generate /
fork / crop / reorder / snapshot / restore / reset, with valid and invalid arguments, on the
reference backend and on the interpreter of the built network (and, in
``test_gpu_session_state_machine.py``, on the TensorRT backend with an engine of that
network, closed part-way through).

A plain-Python model holds each slot's cached token ids. Before every call the model decides
whether the call is valid; a valid call must succeed and leave lengths equal to the model's
and every cached row equal to a fresh recomputation of the slot's tokens; an invalid call
must raise a TrtKvError and leave the lengths and every cache byte unchanged.

The network backends hold CAPACITY = 3 slots on a network built for MAX_BATCH = 2 (steps run
on windows of slots): a step of 3 sequences fits no optimization profile and is invalid
there. After a backend's ``close()`` every call is invalid and must raise ClosedError.
"""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
)

from tests.support.tiny_models import TINY_GQA
from trt_kv.errors import ClosedError, TrtKvError
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

V = TINY_GQA.vocab_size
# S_MAX 8: a float32 slot of N = 2, H = 8 is 512 bytes, so a device window may start at any
# slot (256-byte aligned addresses), as on the host.
CAPACITY, S_MAX, STEP, MAX_BATCH = 3, 8, 4, 2
WEIGHTS = random_weights(TINY_GQA, seed=5, std=0.3)
NETWORK_SHAPES = {"max_seq_len": S_MAX, "max_batch": MAX_BATCH, "max_step_tokens": STEP}

# Token ids: mostly valid, sometimes negative, >= V, a float or a bool.
token_id = st.one_of(
    st.integers(0, V - 1),
    st.integers(0, V - 1),
    st.integers(0, V - 1),
    st.sampled_from([-1, V, V + 7]),
    st.sampled_from([1.0, 2.5, True]),
)
valid_id = st.integers(0, V - 1)
valid_prompt = st.lists(valid_id, min_size=1, max_size=STEP)
# Half the lists hold valid ids only, so that batches of valid lists (which only a profile
# or a closed backend can refuse) are common.
token_list = st.one_of(
    st.lists(valid_id, min_size=1, max_size=STEP), st.lists(token_id, max_size=STEP + 1)
)
# Prompts up to past S_max: wider than STEP they are prefilled in chunks.
prompt_list = st.one_of(
    st.lists(valid_id, min_size=1, max_size=S_MAX), st.lists(token_id, max_size=S_MAX + 1)
)
slot_arg = st.one_of(st.integers(-1, CAPACITY), st.sampled_from([1.0, True]))
length_arg = st.one_of(st.integers(-S_MAX - 2, S_MAX + 1), st.sampled_from([1.5, False]))


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_slot(x):
    return is_int(x) and 0 <= x < CAPACITY


def is_id(x):
    return is_int(x) and 0 <= x < V


def fits_in_chunks(before, counts):
    """Whether feeding ``counts[k]`` tokens to slots holding ``before[k]`` fits S_MAX.

    A step wider than STEP runs as chunks of STEP tokens; chunk c feeds every sequence that
    still has tokens, one padded step per run of consecutive such slots, and a padded step
    writes its full width at every slot of the run.
    """
    for offset in range(0, max(counts), STEP):
        active = [k for k, n in enumerate(counts) if n > offset]
        runs = [[active[0]]]
        for k in active[1:]:
            if k == runs[-1][-1] + 1:
                runs[-1].append(k)
            else:
                runs.append([k])
        for run in runs:
            width = max(min(STEP, counts[k] - offset) for k in run)
            if max(before[k] + offset for k in run) + width > S_MAX:
                return False
    return True


_FRESH = {}


def recomputed(tokens):
    """Every cache's rows ``[N, L, H]`` for ``tokens`` fed to an empty cache in one step."""
    key = tuple(tokens)
    if key not in _FRESH:
        s = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=1, max_seq_len=S_MAX))
        s.prefill([list(tokens)])
        _FRESH[key] = s.snapshot(0)
    return _FRESH[key]


class SessionMachine(RuleBasedStateMachine):
    """On the reference backend: no profiles, every batch up to CAPACITY runs."""

    snapshots = Bundle("snapshots")
    max_batch = CAPACITY  # most sequences one step may hold
    atol = 1e-5  # cached rows against the reference's recomputation

    def make_backend(self):
        return ReferenceBackend(
            TINY_GQA, WEIGHTS, capacity=CAPACITY, max_seq_len=S_MAX, max_step_tokens=STEP
        )

    def __init__(self):
        super().__init__()
        self.backend = self.make_backend()
        self.session = Session(self.backend)
        self.model = [[] for _ in range(CAPACITY)]  # cached token ids per slot
        self.closed = False
        self.calls = 0

    def teardown(self):
        if hasattr(self.backend, "close"):
            self.backend.close()

    def caches(self):
        """Every cache ``[CAPACITY, N, S_max, H]`` as host arrays (any storage)."""
        storage = self.session.storage
        return {
            a.input: np.stack([storage.read_slot(a.input, s) for s in range(CAPACITY)])
            for a in storage.aliases
        }

    # -- the contract ----------------------------------------------------------------------
    def attempt(self, valid, call, effect=None):
        self.calls += 1
        if valid and not self.closed:
            result = call()
            if effect is not None:
                effect(result)
            return result
        arrays = None if self.closed else self.caches()
        lengths = self.session.state.lengths
        try:
            call()
        except ClosedError:
            assert self.closed, "ClosedError from an open backend"
        except TrtKvError:
            assert not self.closed, "a closed backend must raise ClosedError first"
        else:
            raise AssertionError("an invalid call was accepted")
        np.testing.assert_array_equal(self.session.state.lengths, lengths)
        if arrays is not None:
            for name, now in self.caches().items():
                assert now.tobytes() == arrays[name].tobytes(), name
        return None

    def step_valid(self, seqs, lo, from_empty):
        if not is_int(lo) or not seqs or lo < 0 or lo + len(seqs) > CAPACITY:
            return False
        if len(seqs) > self.max_batch:  # no optimization profile holds the batch
            return False
        if any(not seq or not all(is_id(t) for t in seq) for seq in seqs):
            return False
        before = [0 if from_empty else len(self.model[lo + k]) for k in range(len(seqs))]
        return fits_in_chunks(before, [len(seq) for seq in seqs])

    # -- rules -------------------------------------------------------------------------------
    @rule(prompts=st.lists(prompt_list, min_size=0, max_size=CAPACITY + 1), lo=slot_arg)
    def prefill(self, prompts, lo):
        def effect(_):
            for k, p in enumerate(prompts):
                self.model[lo + k] = list(p)

        valid = self.step_valid(prompts, lo, from_empty=True)
        self.attempt(valid, lambda: self.session.prefill(prompts, lo), effect)

    @rule(
        prompts=st.lists(valid_prompt, min_size=1, max_size=MAX_BATCH),
        lo=st.integers(0, CAPACITY - 1),
    )
    def fill(self, prompts, lo):
        """A prefill of valid ids (the other rules mostly try bad arguments on an empty
        cache): fills the slots, or fails only on the window or the batch (above the
        profiles' max_batch on the network backends)."""
        self.prefill(prompts, lo)

    @rule(
        prompts=st.lists(valid_prompt, min_size=CAPACITY, max_size=CAPACITY), new=st.integers(1, 2)
    )
    def fill_every_slot(self, prompts, new):
        """CAPACITY valid prompts at once (prefill, then generate): above the network
        backends' max_batch, refused there with every slot kept."""
        self.prefill(prompts, 0)
        self.generate(prompts, new)

    @rule(tokens=st.lists(token_list, min_size=1, max_size=CAPACITY), lo=slot_arg)
    def step(self, tokens, lo):
        def effect(_):
            for k, t in enumerate(tokens):
                self.model[lo + k] += list(t)

        valid = self.step_valid(tokens, lo, from_empty=False)
        self.attempt(valid, lambda: self.session.step(tokens, lo), effect)

    @rule(ids=st.lists(token_id, min_size=0, max_size=CAPACITY + 1), lo=slot_arg)
    def decode(self, ids, lo):
        def effect(_):
            for k, t in enumerate(ids):
                self.model[lo + k].append(t)

        valid = self.step_valid([[t] for t in ids], lo, from_empty=False)
        self.attempt(valid, lambda: self.session.decode(ids, lo), effect)

    @rule(src=slot_arg, dst=slot_arg)
    def fork(self, src, dst):
        def effect(_):
            self.model[dst] = list(self.model[src])

        valid = is_slot(src) and is_slot(dst)
        self.attempt(valid, lambda: self.session.fork(src, dst), effect)

    @rule(slot=slot_arg, length=length_arg)
    def crop(self, slot, length):
        valid = is_slot(slot) and is_int(length) and length <= len(self.model[slot])

        def effect(_):
            keep = max(len(self.model[slot]) + length, 0) if length < 0 else length
            self.model[slot] = self.model[slot][:keep]

        self.attempt(valid, lambda: self.session.crop(slot, length), effect)

    @rule(order=st.lists(slot_arg, min_size=0, max_size=CAPACITY + 1))
    def reorder(self, order):
        def effect(_):
            moved = [list(self.model[s]) for s in order]
            self.model[: len(order)] = moved

        valid = all(is_slot(s) for s in order) and len(order) <= CAPACITY
        self.attempt(valid, lambda: self.session.reorder(order), effect)

    @rule(slot=st.one_of(st.none(), slot_arg))
    def reset(self, slot):
        def effect(_):
            for s in range(CAPACITY) if slot is None else [slot]:
                self.model[s] = []

        valid = slot is None or is_slot(slot)
        self.attempt(valid, lambda: self.session.reset(slot), effect)

    @rule(
        prompts=st.lists(prompt_list, min_size=0, max_size=CAPACITY + 1),
        new=st.integers(0, 3),
    )
    def generate(self, prompts, new):
        """Interleaved generates, often failing (too many prompts, bad ids, no room)."""

        def effect(result):  # each slot holds its prompt and every new token but the last
            for k, p in enumerate(prompts):
                self.model[k] = list(p) + result.ids[k][:-1]

        valid = (
            new >= 1
            and self.step_valid(prompts, 0, from_empty=True)
            and all(len(p) + new - 1 <= S_MAX for p in prompts)
        )
        self.attempt(valid, lambda: generate(self.session, prompts, new), effect)

    @rule(target=snapshots, slot=st.integers(0, CAPACITY - 1))
    def snapshot(self, slot):
        if self.closed:
            self.attempt(False, lambda: self.session.snapshot(slot))
            return multiple()
        return self.session.snapshot(slot), list(self.model[slot])

    @rule(slot=st.integers(-1, CAPACITY - 1))
    def snapshot_of_an_unknown_slot(self, slot):
        if slot < 0:
            self.attempt(False, lambda: self.session.snapshot(slot))

    @rule(
        snap=snapshots,
        slot=slot_arg,
        damage=st.sampled_from(["none", "drop", "int", "short_h", "huge", "uneven", "list"]),
    )
    def restore(self, snap, slot, damage):
        arrays, tokens = snap
        arrays = {k: v.copy() for k, v in arrays.items()}
        first = sorted(arrays)[0]
        if damage == "drop":
            del arrays[first]
        elif damage == "int":
            arrays[first] = arrays[first].astype(np.int32)
        elif damage == "short_h":
            arrays[first] = arrays[first][:, :, :-1]
        elif damage == "huge":  # float64 beyond float32 range: would become inf
            arrays[first] = arrays[first].astype(np.float64)
            arrays[first][..., 0] = 1e300
        elif damage == "uneven":
            arrays[first] = np.concatenate([arrays[first], arrays[first][:, :1]], axis=1)
        elif damage == "list":
            arrays = list(arrays.values())
        if damage in ("huge", "uneven") and not tokens:
            damage = "none"  # no rows: nothing out of range, nothing to lengthen

        def effect(_):
            self.model[slot] = list(tokens)

        valid = is_slot(slot) and damage == "none"
        self.attempt(valid, lambda: self.session.restore(slot, arrays), effect)

    # -- after every rule ------------------------------------------------------------------
    @invariant()
    def lengths_and_rows_match_the_model(self):
        np.testing.assert_array_equal(self.session.state.lengths, [len(t) for t in self.model])
        if self.closed:
            return  # the caches are gone; every call must raise ClosedError
        caches = self.caches()
        for slot, tokens in enumerate(self.model):
            if not tokens:
                continue
            want = recomputed(tokens)
            for name, rows in want.items():
                got = caches[name][slot, :, : len(tokens)]
                np.testing.assert_allclose(got, rows, rtol=self.atol, atol=self.atol, err_msg=name)


class InterpreterMachine(SessionMachine):
    """The interpreter of the built float32 network: CAPACITY slots, MAX_BATCH per step."""

    max_batch = MAX_BATCH
    atol = 1e-4  # the network's float32 order of operations, not the reference's

    def make_backend(self):
        return InterpreterBackend(_network(), capacity=CAPACITY)


_NETWORKS = []


def _network():
    if not _NETWORKS:
        _NETWORKS.append(build_llama_network(TINY_GQA, WEIGHTS, dtype="float32", **NETWORK_SHAPES))
    return _NETWORKS[0]


SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
}
SessionMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=25, **SETTINGS)
test_session_state_machine = SessionMachine.TestCase
InterpreterMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, **SETTINGS)
test_session_state_machine_on_the_interpreter = InterpreterMachine.TestCase
