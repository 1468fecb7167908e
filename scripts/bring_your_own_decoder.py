"""Bring your own decoder: a small network that is neither Llama nor GPT-2, built with the
public builder API, declared to the runtime by its roles, then decoded on the CPU
interpreter and on the (emulated) GPU with trt_kv's session and decode loop.

The network: token embedding, one single-head attention layer with ALiBi position biases
(no position table, no RoPE), a residual, a head. Its tensors have their own names
(``tokens``, ``pos``, ``rows``, ``last``, ``k_cache``...): the role map says which is which.
Its second version takes embeddings ``[B, S, D]`` (role ``embeddings``): the embedding gather
moves to the host, into the ``embed`` function each backend is given, and the same weights
give the same ids.

    python scripts/bring_your_own_decoder.py            # interpreter, emulated GPU, NumPy
    python scripts/bring_your_own_decoder.py --gpu      # the GPU backends on a real GPU

It prints the greedy ids of each backend and of a plain NumPy forward (no cache), and exits
1 unless they agree. See docs/bring-your-own-decoder.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from trt_kv._trt import trt
from trt_kv.builder import (
    DecoderNetwork,
    add_cache_input,
    add_kv_cache_update,
    create_network,
    decoder_roles,
)
from trt_kv.builder.contract import decoder_profiles

V, D, S_MAX, SLOPE = 37, 16, 24, 0.5  # vocabulary, width, cache length, ALiBi slope
NAMES = {
    "token_ids": "tokens",
    "positions": "pos",
    "write_indices": "rows",
    "last_token_rows": "last",
}
EMBEDDINGS_NAMES = {**{k: v for k, v in NAMES.items() if k != "token_ids"}, "embeddings": "embeds"}
PROMPTS = [[3, 14, 15, 9, 26], [5, 35]]


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {k: rng.normal(0, 0.5, (D, D)).astype(np.float32) for k in ("wq", "wk", "wv", "wo")}
    tables = {k: rng.normal(0, 1.0, (V, D)).astype(np.float32) for k in ("embed", "head")}
    return {**w, **tables}


def build(
    w: dict[str, np.ndarray],
    max_batch: int = 2,
    max_step_tokens: int = 8,
    *,
    embeddings: bool = False,
) -> object:
    """The network, its profiles and roles, as a :class:`DecoderNetwork`; with
    ``embeddings``, its input is ``embeds [B, S, D]`` float32 (``w["embed"][ids]``), not ids."""
    builder, net = create_network()
    keep: list[np.ndarray] = []  # TensorRT reads constants when it builds: keep them alive

    def const(a: np.ndarray) -> object:
        keep.append(np.ascontiguousarray(a))
        dtype = trt.int64 if a.dtype == np.int64 else trt.float32
        return net.add_constant(
            a.shape, trt.Weights(dtype, keep[-1].ctypes.data, a.size)
        ).get_output(0)

    def op(a: object, b: object, kind: object) -> object:
        return net.add_elementwise(a, b, kind).get_output(0)

    def matmul(a: object, b: object, transpose_b: bool = False) -> object:
        mb = trt.MatrixOperation.TRANSPOSE if transpose_b else trt.MatrixOperation.NONE
        return net.add_matrix_multiply(a, trt.MatrixOperation.NONE, b, mb).get_output(0)

    def reshape(x: object, dims: tuple) -> object:
        layer = net.add_shuffle(x)
        layer.reshape_dims = dims
        return layer.get_output(0)

    E = trt.ElementWiseOperation
    if embeddings:
        x = net.add_input("embeds", trt.float32, (-1, -1, D))  # [B, S, D]
    else:
        tokens = net.add_input("tokens", trt.int32, (-1, -1))  # [B, S]
        x = net.add_gather(const(w["embed"]), tokens, 0).get_output(0)  # [B, S, D]
    pos = net.add_input("pos", trt.int64, (-1, -1))  # [B, S]
    rows = net.add_input("rows", trt.int32, (-1,))  # [B]: first cache row written
    last = net.add_input("last", trt.int32, (-1,))  # [B]: row of each last token in [B * S]
    caches = [
        add_cache_input(net, n, num_heads=1, max_seq_len=S_MAX, head_dim=D, dtype="float32")
        for n in ("k_cache", "v_cache")
    ]
    q, k, v = (matmul(x, const(w[n][None])) for n in ("wq", "wk", "wv"))  # [B, S, D]
    k, v = (reshape(t, (0, 1, -1, D)) for t in (k, v))  # [B, 1, S, D]
    k_all, v_all = (
        add_kv_cache_update(net, c, t, rows, output_name=f"{c.name}_out").output
        for c, t in zip(caches, (k, v))
    )  # [B, 1, S_max, D]
    scores = matmul(reshape(q, (0, 1, -1, D)), k_all, transpose_b=True)  # [B, 1, S, S_max]
    scores = op(scores, const(np.full((1, 1, 1, 1), D**-0.5, np.float32)), E.PROD)
    j = const(np.arange(S_MAX, dtype=np.int64).reshape(1, 1, 1, -1))
    dist = op(reshape(pos, (0, 1, -1, 1)), j, E.SUB)  # [B, 1, S, S_max]: pos - j
    dist32 = net.add_cast(dist, trt.float32).get_output(0)
    scores = op(scores, op(dist32, const(np.full((1, 1, 1, 1), -SLOPE, np.float32)), E.PROD), E.SUM)
    future = op(j, reshape(pos, (0, 1, -1, 1)), E.GREATER)  # key after the query
    lowest = const(np.full((1, 1, 1, 1), -1e30, np.float32))
    scores = net.add_select(future, lowest, scores).get_output(0)
    softmax = net.add_softmax(scores)
    softmax.axes = 1 << 3
    # rows past every query's position may hold anything (unwritten memory): zero them in V
    newest = net.add_reduce(pos, trt.ReduceOperation.MAX, 1 << 1, True).get_output(0)  # [B, 1]
    unseen = op(reshape(j, (1, 1, -1, 1)), reshape(newest, (0, 1, 1, 1)), E.GREATER)
    zero = const(np.zeros((1, 1, 1, 1), np.float32))
    v_all = net.add_select(unseen, zero, v_all).get_output(0)
    attended = reshape(matmul(softmax.get_output(0), v_all), (0, -1, D))  # [B, S, D]
    x = op(x, matmul(attended, const(w["wo"][None])), E.SUM)
    picked = net.add_gather(reshape(x, (-1, D)), last, 0).get_output(0)  # [B, D]
    logits = matmul(picked, const(w["head"]), transpose_b=True)  # [B, V] float32
    logits.name = "logits"
    net.mark_output(logits)
    names = EMBEDDINGS_NAMES if embeddings else NAMES
    profiles = decoder_profiles(
        net, max_batch=max_batch, max_step_tokens=max_step_tokens, names=names
    )
    roles = decoder_roles(net, profiles, names=names)  # checks every role; raises if not
    return DecoderNetwork(builder, net, profiles, roles, keep)


def numpy_greedy(w: dict[str, np.ndarray], prompt: list[int], n: int) -> list[int]:
    """The same model in NumPy over the whole sequence (no cache): ``n`` greedy ids."""
    ids = list(prompt)
    for _ in range(n):
        x = w["embed"][ids]  # [T, D]
        q, k, v = (x @ w[m] for m in ("wq", "wk", "wv"))
        t = np.arange(len(ids))
        dist = (t[:, None] - t[None, :]).astype(np.float32)
        scores = q @ k.T * D**-0.5 - SLOPE * dist
        scores[dist < 0] = -np.inf
        p = np.exp(scores - scores.max(-1, keepdims=True))
        x = x + (p / p.sum(-1, keepdims=True)) @ v @ w["wo"]
        ids.append(int(np.argmax(x[-1] @ w["head"].T)))
    return ids[len(prompt) :]


def decode_everywhere(w: dict[str, np.ndarray], n: int, gpu: bool, embeddings: bool) -> dict:
    """``n`` greedy ids of :data:`PROMPTS` on the interpreter and the (emulated) GPU
    backends, for the network of ids or (``embeddings``) the one of embeddings."""
    from contextlib import nullcontext

    from trt_kv.emulator import emulated_gpu
    from trt_kv.engine.store import build_to_file
    from trt_kv.runtime import Session, generate
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend
    from trt_kv.runtime.interpreter_backend import InterpreterBackend

    # the embedding gather, on the host: ids [B, S] int32 -> [B, S, D] float32
    extra = {"embed": lambda ids: w["embed"][ids]} if embeddings else {}
    kind = " (embeddings)" if embeddings else ""
    backend = InterpreterBackend(build(w, embeddings=embeddings), **extra)
    results = {"interpreter" + kind: generate(Session(backend), PROMPTS, n).ids}
    where = f" ({'GPU' if gpu else 'emulated GPU'}{', embeddings' if embeddings else ''})"
    with nullcontext() if gpu else emulated_gpu(), tempfile.TemporaryDirectory() as tmp:
        net = build(w, embeddings=embeddings)  # built under the emulator: it records the network
        path = build_to_file(
            net.builder,
            net.network,
            net.profiles,
            Path(tmp) / "alibi.engine",
            {"model": "alibi-example"},
            net.roles,
        ).path
        for name, make in (("tensorrt", TrtBackend), ("polygraphy", PolygraphyBackend)):
            backend = make(path, **extra)
            try:
                results[name + where] = generate(Session(backend), PROMPTS, n).ids
            finally:
                backend.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="a real GPU, not the emulated one")
    parser.add_argument("--new-tokens", type=int, default=10)
    args = parser.parse_args()
    w, n = weights(), args.new_tokens
    results = {"numpy": [numpy_greedy(w, p, n) for p in PROMPTS]}
    for embeddings in (False, True):
        results.update(decode_everywhere(w, n, args.gpu, embeddings))
    for name, ids in results.items():
        print(f"{name:<38} {ids}")
    agree = all(ids == results["numpy"] for ids in results.values())
    print("all backends agree with NumPy" if agree else "MISMATCH")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
