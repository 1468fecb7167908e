"""Bad calls to the session API: a named error, and nothing changed (lengths and every cache
byte), whatever the call: bad arguments, a batch no profile holds, a second thread on a busy
session or backend, malformed token arrays and stop ids (issue 30), an immutable sampler."""

import dataclasses
import math
import threading

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.errors import (
    ArgumentError,
    CacheOverflowError,
    ConcurrentUseError,
    DTypeError,
    ShapeError,
    SlotError,
    TrtKvError,
)
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend, llama_cache_aliases
from trt_kv.runtime import HostCaches, Sampler, Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

V = TINY_GQA.vocab_size  # 64
WEIGHTS = random_weights(TINY_GQA, seed=4, std=0.3)
S_MAX, STEP = 12, 6
T_RANGE = r"temperature: expected 0 \(greedy\) or a number in \[0.001, 1000\], got "


def session(capacity=3):
    backend = ReferenceBackend(
        TINY_GQA, WEIGHTS, capacity=capacity, max_seq_len=S_MAX, max_step_tokens=STEP
    )
    s = Session(backend)
    s.prefill([[1, 2, 3], [4, 5], [6]])
    return s


@pytest.fixture(scope="module")
def net():
    return build_llama_network(TINY_GQA, WEIGHTS, max_seq_len=S_MAX, max_batch=2, max_step_tokens=4)


def refused(s, exc, match, call):
    """``call(s)`` raises ``exc`` matching ``match`` and leaves ``s`` exactly as it was."""
    lengths = s.state.lengths
    arrays = {k: v.copy() for k, v in s.storage.arrays.items()}
    with pytest.raises(exc, match=match):
        call(s)
    np.testing.assert_array_equal(s.state.lengths, lengths)
    for name, before in arrays.items():
        assert s.storage.arrays[name].tobytes() == before.tobytes(), name


@pytest.mark.parametrize(
    ("prompts", "lo", "exc", "match"),
    [
        # longer than max_step_tokens: chunked, so only S_max bounds it (found in chunk 3)
        ([[1] * (S_MAX + 1)], 0, CacheOverflowError, r"slot 0: expected length .* got 12 \+ 1"),
        ([[1], []], 0, SlotError, "slot 1: expected at least one new token"),
        ([[1]] * 4, 0, SlotError, "batch: expected at most capacity = 3, got 4"),
        ([[1], [2]], 2, SlotError, r"slot: expected an integer in \[0, 3\), got 3"),
        ([[1, -1]], 0, ArgumentError, rf"slot 0: expected token ids in \[0, {V}\), got -1"),
        ([[1], [V]], 0, ArgumentError, rf"slot 1: expected token ids in \[0, {V}\), got {V}"),
        ([[1.7]], 0, DTypeError, "slot 0: expected integer token ids, got 1.7"),
        ([[True]], 0, DTypeError, "slot 0: expected integer token ids, got True"),
        ([[1, True]], 0, DTypeError, "slot 0: expected integer token ids, got True"),
        ([[1, 2.0]], 0, DTypeError, "slot 0: expected integer token ids, got 2.0"),
        ([np.array([1.0])], 0, DTypeError, "slot 0: expected integer token ids, got dtype float64"),
        ([3], 0, ShapeError, "slot 0: expected a 1-D list of token ids, got 3"),
        ("abc", 0, ShapeError, "tokens: expected one list of token ids per slot"),
        ([], 0, SlotError, "slots: expected one non-empty token list per slot"),
        ([[1]], 1.0, ArgumentError, "lo: expected an integer, got 1.0"),
        ([[1]], -1, SlotError, r"slot: expected an integer in \[0, 3\), got -1"),
    ],
)
def test_bad_prefill_is_refused_before_any_slot_is_reset(prompts, lo, exc, match):
    refused(session(), exc, match, lambda s: s.prefill(prompts, lo))


@pytest.mark.parametrize(
    ("tokens", "exc", "match"),
    [
        ([1.7, 2, 3], DTypeError, "tokens: expected integer token ids, got 1.7"),
        ([0, True, 2], DTypeError, "tokens: expected integer token ids, got True"),
        (np.array([0.0, 1.0]), DTypeError, "tokens: expected integer token ids, got dtype float64"),
        ([1, 2, V], ArgumentError, rf"tokens: expected token ids in \[0, {V}\), got {V}"),
        (np.array([1, -2, 3]), ArgumentError, "got -2"),
        ([[1], [2], [3]], ShapeError, r"tokens: expected one token id per slot \[B\]"),
        ([1, 2, 3, 4], SlotError, "batch: expected at most capacity = 3, got 4"),
    ],
)
def test_bad_decode_is_refused(tokens, exc, match):
    refused(session(), exc, match, lambda s: s.decode(tokens))


def test_bad_step_is_refused():
    s = session()
    s.step([[1] * 5])  # slot 0 holds 8 of 12 rows
    refused(s, CacheOverflowError, r"slot 0: .* got 8 \+ 5 = 13", lambda x: x.step([[1] * 5]))
    refused(session(), ArgumentError, "got 99", lambda s: s.step(np.full((3, 2), 99)))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda s: s.crop(0, 2.5), ArgumentError, "length: expected an integer, got 2.5"),
        (lambda s: s.crop(0, True), ArgumentError, "length: expected an integer, got True"),
        (lambda s: s.crop(0, 4), CacheOverflowError, "crop length <= current length 3, got 4"),
        (lambda s: s.crop(1.0, 1), SlotError, r"slot: expected an integer in \[0, 3\)"),
        (lambda s: s.fork(0, True), SlotError, "got True"),
        (lambda s: s.fork(0, 3), SlotError, "got 3"),
        (lambda s: s.reset(5), SlotError, "got 5"),
        (lambda s: s.reorder([0, 1.0]), SlotError, "got 1.0"),
        (lambda s: s.reorder(2), SlotError, "order: expected a sequence of slots, got 2"),
        (lambda s: s.reorder([0, 0, 0, 0]), SlotError, "order: expected at most 3 slots"),
        (lambda s: s.snapshot(-1), SlotError, "got -1"),
        (lambda s: s.export_legacy(0), SlotError, "slots: expected a sequence of slots"),
    ],
)
def test_bad_cache_operation_is_refused(call, exc, match):
    refused(session(), exc, match, call)


def test_restore_refuses_malformed_snapshots():
    s = session()
    good = s.snapshot(0)
    bad_dtype = {k: v.astype(np.int32) for k, v in good.items()}
    refused(
        s,
        DTypeError,
        "expected floating-point rows, got dtype int32",
        lambda x: x.restore(1, bad_dtype),
    )
    refused(s, ShapeError, "snapshot: expected one", lambda x: x.restore(1, list(good.values())))
    uneven = dict(good, **{"past_value.1": good["past_value.1"][:, :2]})
    refused(s, ShapeError, "one length L for every cache", lambda x: x.restore(1, uneven))


def test_float32_snapshot_beyond_float16_range_is_refused_and_nothing_is_written():
    storage = HostCaches(llama_cache_aliases(TINY_GQA, S_MAX, "float16"), 2)
    names = [a.input for a in storage.aliases]
    snap = {n: np.ones((2, 3, 8), np.float32) for n in names}
    snap[names[-1]][1, 2, 5] = 7e4  # float16 max is 65504: it would become inf
    with pytest.raises(DTypeError, match=rf"{names[-1]}: expected values within float16 range"):
        storage.restore(0, snap)
    assert not any(arr.any() for arr in storage.arrays.values())
    snap[names[-1]][1, 2, 5] = 6e4  # fits: written, rounded to float16
    assert storage.restore(0, snap) == 3
    assert storage.arrays[names[-1]][0, 1, 2, 5] == np.float16(6e4)


@pytest.mark.parametrize("arity", [1, 3])
def test_legacy_pairs_of_the_wrong_arity_are_refused(arity):
    s = session()
    past = [layer[:1] * arity for layer in s.export_legacy([2])]
    refused(
        s,
        ShapeError,
        rf"past_key_values\[0\]: expected a \(key, value\) pair, got {arity}",
        lambda x: x.import_legacy(past, [1]),
    )


def test_legacy_import_refuses_values_the_cache_cannot_hold():
    s = session()
    past = [
        tuple(a.astype(np.float64) * 1e300 + 1e300 for a in layer) for layer in s.export_legacy([2])
    ]
    refused(
        s,
        DTypeError,
        "past_key.0: expected values within float32",
        lambda x: x.import_legacy(past, [1]),
    )


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_generate_refuses_max_new_tokens_below_one_or_not_an_integer(n):
    refused(
        session(),
        ArgumentError,
        "max_new_tokens: expected an integer",
        lambda s: generate(s, [[1, 2]], max_new_tokens=n),
    )


def test_generate_refuses_out_of_vocabulary_prompts_before_resetting():
    refused(session(), ArgumentError, "got 64", lambda s: generate(s, [[1, 64]], 2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"temperature": -0.5},
            r"temperature: expected 0 \(greedy\) or a number in \[0.001, 1000\], got -0.5",
        ),
        (
            {"temperature": math.nan},
            r"temperature: expected 0 \(greedy\) or a number in \[0.001, 1000\], got nan",
        ),
        (
            {"temperature": math.inf},
            r"temperature: expected 0 \(greedy\) or a number in \[0.001, 1000\], got inf",
        ),
        ({"temperature": "1"}, "temperature: expected a real number, got '1'"),
        ({"temperature": 1e-320}, T_RANGE + "1e-320"),  # logits / T overflowed: NaN
        ({"temperature": 1e-4}, T_RANGE + "0.0001"),
        ({"temperature": 1e4}, T_RANGE + "10000.0"),
        ({"temperature": 1.0, "top_k": 0}, "top_k: expected an integer >= 1, got 0"),
        ({"temperature": 1.0, "top_k": -3}, "top_k: expected an integer >= 1, got -3"),
        ({"temperature": 1.0, "top_k": 2.5}, "top_k: expected an integer >= 1, got 2.5"),
        ({"seed": -1}, "seed: expected an integer >= 0, got -1"),
    ],
)
def test_sampler_refuses_arguments_it_would_reinterpret(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        Sampler(**kwargs)


def test_every_error_here_is_a_trt_kv_error():
    for exc in (ArgumentError, CacheOverflowError, DTypeError, ShapeError, SlotError):
        assert issubclass(exc, TrtKvError)


def test_ragged_rows_in_a_snapshot_are_a_shape_error():
    s = session()
    snap = s.snapshot(0)
    name = sorted(snap)[0]
    snap[name] = [[[0.0] * 8, [0.0]]]  # ragged nesting: NumPy cannot make an array
    refused(s, ShapeError, f"{name}: expected an array, got list", lambda x: x.restore(1, snap))


def test_legacy_import_into_a_repeated_slot_is_refused():
    s = session()
    past = s.export_legacy([0, 0])
    refused(
        s,
        SlotError,
        r"slots: expected distinct slots, got \[1, 1\]",
        lambda x: x.import_legacy(past, [1, 1]),
    )


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"capacity": 0}, ArgumentError, r"capacity: expected an integer >= 1, got 0"),
        ({"max_seq_len": -1}, ArgumentError, r"max_seq_len: expected an integer >= 1, got -1"),
        (
            {"max_step_tokens": S_MAX + 1},
            ArgumentError,
            rf"max_step_tokens: expected an integer in \[1, {S_MAX}\], got {S_MAX + 1}",
        ),
        (
            {"weights": random_weights(dataclasses.replace(TINY_GQA, vocab_size=V + 1))},
            ShapeError,
            rf"model.embed_tokens.weight: expected shape \({V}, 32\), got \({V + 1}, 32\)",
        ),
        # 2 x 2 x 2**40 x 8 float32 = 128 TiB per cache: beyond any address space
        (
            {"max_seq_len": 2**40},
            ArgumentError,
            r"caches \[capacity=2, N, S_max=1099511627776, H\] x 4: expected a size that fits "
            r"host memory, asked for 562,949,953,421,312 bytes, got MemoryError",
        ),
    ],
)
def test_reference_backend_refuses_bad_sizes_and_weights_by_name(kwargs, exc, message):
    args = {"weights": WEIGHTS, "capacity": 2, "max_seq_len": S_MAX, **kwargs}
    with pytest.raises(exc, match=f"^{message}"):
        ReferenceBackend(TINY_GQA, **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sampler": "greedy"}, "sampler: expected a Sampler or None, got 'greedy'"),
        ({"on_token": 1}, r"on_token: expected a callable on_token\(k, token_id\) or None, got 1"),
    ],
)
def test_generate_refuses_a_sampler_or_callback_of_the_wrong_kind_before_resetting(kwargs, match):
    """Both were a TypeError from inside the loop, after the prefill had reset the slots."""
    refused(session(), ArgumentError, match, lambda s: generate(s, [[1, 2]], 2, **kwargs))


def test_interpreter_backend_refuses_a_capacity_of_zero_or_no_network(net):
    """capacity=0 was taken as the network's max_batch; None failed inside, after the
    process-wide malloc setting had changed."""
    with pytest.raises(ArgumentError, match=r"^capacity: expected an integer >= 1, got 0$"):
        InterpreterBackend(net, capacity=0)
    with pytest.raises(
        ArgumentError, match=r"^net: expected a network with decoder roles .*, got NoneType$"
    ):
        InterpreterBackend(None)


@pytest.mark.parametrize("module", ["trt_backend", "polygraphy_backend"])
def test_gpu_backends_refuse_a_capacity_of_zero_before_loading_anything(module, tmp_path):
    import importlib

    cls = {"trt_backend": "TrtBackend", "polygraphy_backend": "PolygraphyBackend"}[module]
    backend = getattr(importlib.import_module(f"trt_kv.runtime.gpu.{module}"), cls)
    with pytest.raises(ArgumentError, match=r"^capacity: expected an integer >= 1, got 0$"):
        backend(tmp_path / "none.engine", capacity=0)  # no file, no GPU needed to refuse


def test_a_batch_above_max_batch_is_refused_before_any_slot_is_reset(net):
    """capacity 4 > max_batch 2 is by design (steps run on windows of slots), but a step of
    3 sequences fits no profile: prefill reset slots 0 and 1 before the step said so."""
    s = Session(InterpreterBackend(net, capacity=4))
    s.prefill([[1, 2, 3], [4, 5]])
    three = [[1], [2], [3]]
    batch = r"step shapes: expected a profile that holds them, got .*input_ids in \[1, 1\]"
    refused(s, ShapeError, batch, lambda x: x.prefill(three))
    refused(s, ShapeError, batch, lambda x: generate(x, three, 2))
    refused(s, ShapeError, batch, lambda x: x.step([[1, 2], [3], [4]]))
    assert s.state.lengths.tolist() == [3, 2, 0, 0]
    s.prefill([[7], [8]], lo=2)  # two at a time still run, in any window
    assert s.state.lengths.tolist() == [3, 2, 1, 1]


def test_a_chunked_prefill_checks_every_chunk_before_the_first_runs(net):
    s = Session(InterpreterBackend(net, capacity=4))
    s.prefill([[1, 2, 3], [4, 5]])
    # 6 tokens: chunks of 4 and 2, the first of slots 0 and 1, the second of 0, 1 and 2
    long = [[1] * 6, [2] * 6, [3] * 6]
    refused(s, ShapeError, "step shapes: expected a profile", lambda x: x.prefill(long))


class _Gated:
    """A user's backend whose step waits until the test lets it go (a step in flight)."""

    name = "gated"

    def __init__(self) -> None:
        self.inner = ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=S_MAX)
        self.storage, self.vocab_size = self.inner.storage, self.inner.vocab_size
        self.max_step_tokens = self.inner.max_step_tokens
        self.entered, self.release = threading.Event(), threading.Event()

    def run(self, plan):
        self.entered.set()
        assert self.release.wait(30)
        return self.inner.run(plan)


@pytest.mark.parametrize(
    ("first", "second", "match"),
    [
        (
            "decode",
            "decode",
            "Session.decode: expected one thread at a time, got another thread in Session.decode",
        ),
        (
            "decode",
            "fork",
            "Session.fork: expected one thread at a time, got another thread in Session.decode",
        ),
        (
            "generate",
            "reset",
            "Session.reset: expected one thread at a time, got another thread in Session.generate",
        ),
    ],
)
def test_a_second_thread_on_a_busy_session_raises_and_changes_nothing(first, second, match):
    """2 threads x 25 decodes gave length 53 and an unwritten cache row: now the second
    call, made while the first is provably inside the backend's step, is refused."""
    backend = _Gated()
    s = Session(backend)
    backend.release.set()
    s.prefill([[1, 2], [3, 4]])
    backend.release.clear()
    backend.entered.clear()
    calls = {
        "decode": lambda: s.decode([5, 6]),
        "generate": lambda: generate(s, [[1, 2], [3]], 3),
        "fork": lambda: s.fork(0, 1),
        "reset": lambda: s.reset(0),
    }
    worker = threading.Thread(target=calls[first])
    worker.start()
    try:
        assert backend.entered.wait(30)  # the first call is inside run() now
        lengths = s.state.lengths
        with pytest.raises(ConcurrentUseError, match=match):
            calls[second]()
        np.testing.assert_array_equal(s.state.lengths, lengths)
    finally:
        backend.release.set()
        worker.join(30)
    s.decode([7, 8])  # free again once the first returned


def test_a_second_session_on_a_busy_backend_raises_and_changes_nothing():
    """Two sessions on one backend share its caches: a step of one while another thread is
    inside the other's step is refused, as on one session."""
    backend = _Gated()
    first, second = Session(backend), Session(backend)
    backend.release.set()
    first.prefill([[1, 2], [3, 4]])
    backend.release.clear()
    backend.entered.clear()
    worker = threading.Thread(target=lambda: first.decode([5, 6]))
    worker.start()
    try:
        assert backend.entered.wait(30)
        with pytest.raises(ConcurrentUseError, match=r"Session.fork: .* in Session.decode"):
            second.fork(0, 1)
        np.testing.assert_array_equal(second.state.lengths, [0] * second.capacity)
    finally:
        backend.release.set()
        worker.join(30)
    second.fork(0, 1)  # free again once the first returned (one thread may use both)


def test_the_sampler_is_immutable():
    """``s.temperature = -1.0`` after construction sampled the inverted distribution."""
    sampler = Sampler(1.0, top_k=3, seed=2)
    for field, value in {"temperature": -1.0, "top_k": 0, "seed": -1, "top_p": 2.0}.items():
        with pytest.raises(AttributeError):
            setattr(sampler, field, value)
    assert (sampler.temperature, sampler.top_k, sampler.seed) == (1.0, 3, 2)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda s: s.step(np.array(5)),
            ShapeError,
            r"tokens: expected an array \[B, S\], got "
            r"shape \(\)",
        ),
        (lambda s: s.step(np.ones((1, 1, 1), np.int64)), ShapeError, "shape \\(1, 1, 1\\)"),
        (
            lambda s: generate(s, [[1]], 2, eos_ids=[2**70]),
            ArgumentError,
            rf"eos_ids: expected token ids in \[0, {V}\), got {2**70}",
        ),
        (
            lambda s: generate(s, [[1]], 2, eos_ids=np.array([[1, 2]])),
            ArgumentError,
            r"eos_ids: expected token ids .*, got \[1, 2\]",
        ),
        (lambda s: generate(s, [[1]], 2, eos_ids=[[1]]), ArgumentError, r"got \[1\]"),
    ],
)
def test_malformed_arrays_and_stop_ids_are_named_errors(call, exc, match):
    """Each was a TypeError or OverflowError (from len() of a 0-d array, iterating it,
    or int64 conversion)."""
    s = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=S_MAX))
    s.prefill([[1, 2, 3]])
    refused(s, exc, match, call)


def test_a_zero_dimensional_array_is_one_stop_id():
    s = Session(ReferenceBackend(TINY_GQA, WEIGHTS, capacity=1, max_seq_len=S_MAX))
    free = generate(s, [[1, 2]], 6).ids[0]
    stop = free[2]
    assert generate(s, [[1, 2]], 6, eos_ids=np.array(stop)).ids[0] == free[: free.index(stop) + 1]
