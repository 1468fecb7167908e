"""Cache operations stay on the device: ``reorder`` as slot copies inside the storage (each
slot written at most once, a cycle through one scratch slot), a prefill's reset as one fill
per cache, ``restore``/``import_legacy`` as one strided ``cudaMemcpy2D`` per cache and slot, and
a bounded set of captured decode graphs.

The move plan is checked against a plain gather; the device caches against host caches byte
for byte (on a real GPU unchanged). What the code asks of the device (calls, bytes by
direction) is counted only on the emulated device (``trt_kv.emulator.counting``): emulated
figures.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.runtime import HostCaches
from trt_kv.runtime.storage import SCRATCH, reorder_moves

# Two caches of [N=2, S_max=8, H=16] float16 slots: 512 bytes a slot (256-byte aligned).
ALIASES = [
    CacheAlias(f"past_{kv}", f"present_{kv}", (-1, 2, 8, 16), "float16") for kv in ("key", "value")
]
CAPACITY = 6


def apply(moves, contents):
    """Run ``moves`` on a list of slot contents (and one scratch slot); count the writes."""
    slots, scratch, writes = list(contents), None, {}
    for src, dst in moves:
        value = scratch if src == SCRATCH else slots[src]
        assert value is not None, "the scratch slot was read before it was written"
        if dst == SCRATCH:
            scratch = value
        else:
            slots[dst] = value
            writes[dst] = writes.get(dst, 0) + 1
    return slots, writes


@pytest.mark.parametrize(
    ("order", "moves"),
    [
        ([0, 1, 2], []),  # nothing moves
        ([1, 0], [(0, SCRATCH), (1, 0), (SCRATCH, 1)]),  # a swap: one scratch save
        ([0, 0, 1], [(1, 2), (0, 1)]),  # slot 1's old contents are read before it is written
        ([2, 0, 1], [(0, SCRATCH), (2, 0), (1, 2), (SCRATCH, 1)]),  # a 3-cycle
        ([1, 1], [(1, 0)]),  # a beam duplicated: one copy
    ],
)
def test_reorder_moves_are_the_fewest_slot_copies(order, moves):
    assert reorder_moves(order) == moves


def test_a_beam_of_four_swapped_in_pairs_moves_each_slot_once():
    moves = reorder_moves([1, 0, 3, 2])
    assert sorted(dst for _, dst in moves if dst != SCRATCH) == [0, 1, 2, 3]
    assert sum(dst == SCRATCH for _, dst in moves) == 2  # one save per cycle


@given(st.integers(1, 7).flatmap(lambda c: st.lists(st.integers(0, c - 1), min_size=1, max_size=c)))
def test_reorder_moves_give_every_slot_its_source_and_write_it_at_most_once(order):
    capacity = max(len(order), max(order) + 1)
    contents = [f"slot {k}" for k in range(capacity)]
    slots, writes = apply(reorder_moves(order), contents)
    expected = [contents[s] for s in order] + contents[len(order) :]
    assert slots == expected
    assert all(n == 1 for n in writes.values())
    assert set(writes) == {k for k, s in enumerate(order) if s != k}


def filled(storage, seed):
    """Give every slot of every cache distinct random rows (same bytes on host and device)."""
    rng = np.random.default_rng(seed)
    for a in ALIASES:
        for slot in range(CAPACITY):
            storage.write_slot(a.input, slot, rng.standard_normal(storage.slot_shape))
    return storage


def all_slots(storage):
    return {
        a.input: [storage.read_slot(a.input, k).tobytes() for k in range(CAPACITY)] for a in ALIASES
    }


ORDERS = ([1, 0, 3, 2], [0, 0, 1, 1, 5, 4], [2, 0, 1], [5, 4, 3, 2, 1, 0], [3, 3, 3])


def test_host_reorder_is_a_gather_of_slots():
    host = filled(HostCaches(ALIASES, CAPACITY), seed=1)
    for order in ORDERS:
        before = all_slots(host)
        host.reorder(order)
        after = all_slots(host)
        for name, slots in before.items():
            assert after[name] == [slots[s] for s in order] + slots[len(order) :]


@pytest.mark.gpu(tensorrt=False)
def test_device_reorder_matches_the_host_and_copies_device_to_device_only():
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime.gpu.device import DeviceCaches

    host = filled(HostCaches(ALIASES, CAPACITY), seed=2)
    dev = filled(DeviceCaches(ALIASES, CAPACITY), seed=2)
    try:
        assert all_slots(dev) == all_slots(host)
        for order in ORDERS:
            host.reorder(order)
            if not is_active():  # a real GPU: bytes only
                dev.reorder(order)
            else:
                with counting() as counts:
                    dev.reorder(order)
                moves = reorder_moves(order)
                assert counts.bytes["HD"] == counts.bytes["DH"] == 0  # no host round trip
                assert counts.calls["cudaMemcpy"] == len(moves) * len(ALIASES)
                assert counts.bytes["DD"] == len(moves) * len(ALIASES) * 512
            assert all_slots(dev) == all_slots(host), order
    finally:
        dev.free()


@pytest.mark.gpu(tensorrt=False)
def test_zeroing_a_run_of_slots_is_one_fill_per_cache_and_leaves_the_others():
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime.gpu.device import DeviceCaches

    host = filled(HostCaches(ALIASES, CAPACITY), seed=3)
    dev = filled(DeviceCaches(ALIASES, CAPACITY), seed=3)
    try:
        host.zero(1, 3)
        if is_active():
            with counting() as counts:
                dev.zero(1, 3)
            assert counts.calls["cudaMemset"] == len(ALIASES)
        else:
            dev.zero(1, 3)
        assert all_slots(dev) == all_slots(host)
        zero = np.zeros(host.slot_shape, np.float16).tobytes()
        for slots in all_slots(host).values():
            assert slots[1:4] == [zero] * 3
            assert zero not in (slots[0], slots[4], slots[5])
    finally:
        dev.free()


@pytest.mark.gpu
def test_captured_graphs_are_bounded_and_evicted_ones_destroyed(tmp_path):
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.emulator import counting, is_active
    from trt_kv.engine.store import build_model_engine
    from trt_kv.models.llama import random_weights
    from trt_kv.runtime import Session
    from trt_kv.runtime.gpu.trt_backend import MAX_GRAPHS, TrtBackend

    weights = random_weights(TINY_GQA, seed=3, std=0.3)
    shapes = {"max_seq_len": 8, "max_batch": 1, "max_step_tokens": 2}
    path = build_model_engine("lru", TINY_GQA, weights, out_dir=tmp_path, **shapes).path
    slots = MAX_GRAPHS + 2  # one binding state (window start) per slot: two more than kept
    backend = TrtBackend(path, capacity=slots, cuda_graph="manual")
    session = Session(backend)
    try:
        if is_active():
            with counting() as counts:
                session.prefill([[1, 2]], lo=0)
            assert counts.calls["cudaMemset"] == len(backend.storage.aliases)  # one per cache
        for lo in range(slots):
            session.prefill([[lo + 1, 2]], lo=lo)  # two tokens: not a decode step
            if is_active():
                with counting() as counts:
                    session.decode([5], lo=lo)  # a fresh enqueue, then its capture
                evicted = int(lo >= MAX_GRAPHS)
                assert counts.calls["cudaGraphExecDestroy"] == evicted
                assert counts.calls["cudaGraphDestroy"] == evicted
            else:
                session.decode([5], lo=lo)
            assert len(backend._graphs) == min(lo + 1, MAX_GRAPHS)
        assert list(backend._graphs) == [((0, lo, 1, 1), "logits") for lo in range(2, slots)]
        session.decode([6], lo=slots - 1)  # the newest state again: a replay
    finally:
        backend.close()


@pytest.mark.gpu(tensorrt=False)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("length", [3, 8])  # short rows, and rows filling S_max = 8
def test_restore_and_import_legacy_are_one_strided_copy_per_cache(dtype, length):
    from trt_kv.builder.model_caches import model_cache_aliases
    from trt_kv.emulator import counting, is_active
    from trt_kv.runtime.gpu.device import DeviceCaches

    aliases = model_cache_aliases(2, num_kv_heads=2, max_seq_len=8, head_dim=16, dtype=dtype)
    rng = np.random.default_rng(length)
    snap = {a.input: rng.standard_normal((2, length, 16)) for a in aliases}
    past = [
        (rng.standard_normal((2, 2, length, 16)), rng.standard_normal((2, 2, length, 16)))
        for _ in range(2)
    ]
    host = HostCaches(aliases, 4)
    dev = DeviceCaches(aliases, 4)
    itemsize = np.dtype(host.dtype(aliases[0].input)).itemsize
    try:
        for caches in (host, dev):
            caches.zero()
        ops = [(lambda c: c.restore(1, snap), 1), (lambda c: c.import_legacy(past, [3, 0]), 2)]
        for op, slots in ops:
            op(host)
            if is_active():
                with counting() as counts:
                    op(dev)
                writes = len(aliases) * slots
                assert counts.calls == {"cudaMemcpy2D": writes}  # no per-head cudaMemcpy
                assert counts.bytes == {"HD": writes * 2 * length * 16 * itemsize}
            else:  # a real GPU: bytes only
                op(dev)
            for a in aliases:
                for slot in range(4):
                    got = dev.read_slot(a.input, slot).tobytes()
                    assert got == host.read_slot(a.input, slot).tobytes(), (a.input, slot)
    finally:
        dev.free()


@pytest.mark.gpu(tensorrt=False)
@pytest.mark.parametrize("rows", [np.zeros((2, 5), np.float32), np.zeros(4, np.float32)])
def test_a_2d_upload_of_rows_wider_than_the_pitch_or_not_2d_is_refused(rows):
    from trt_kv.errors import ArgumentError
    from trt_kv.runtime.gpu.cuda import DeviceBuffer

    buf = DeviceBuffer(64)
    try:
        with pytest.raises(ArgumentError, match="rows of at most 16 bytes"):
            buf.upload_2d(rows, 0, 16)  # 20-byte rows into a 16-byte pitch; a 1-D array
    finally:
        buf.free()
