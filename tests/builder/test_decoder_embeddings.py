"""The ``embeddings`` token role: a network whose first input is ``[B, S, D]`` embeddings,
driven by the same runtime with an ``embed`` function (ids -> embeddings) its backend is
given. The ALiBi decoder of scripts/bring_your_own_decoder.py in its two versions (embedding
gather in the network, or on the host) gives the same ids on every backend."""

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trt_kv._trt import trt
from trt_kv.builder import add_model_caches, create_network, decoder_roles
from trt_kv.builder.contract import decoder_profiles
from trt_kv.contract import DecoderRoles, check_roles
from trt_kv.errors import ArgumentError, DTypeError, NetworkError, ShapeError

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "bring_your_own_decoder", ROOT / "scripts" / "bring_your_own_decoder.py"
)
ALIBI = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ALIBI)
W = ALIBI.weights()
PROMPTS = [[3, 14, 15, 9, 26, 1], [5, 35]]  # 6 > max_step_tokens 4: a chunked prefill
NEW = 6


def embed(ids: np.ndarray) -> np.ndarray:
    """The ALiBi decoder's embedding gather, on the host: [B, S] int32 -> [B, S, 16]."""
    return W["embed"][ids]


def network(**token_inputs):
    """A decoder whose token inputs are ``token_inputs`` (name -> (dtype, shape)), declared
    only (its caches are fed from position_ids); logits [B, 7]."""
    _, net = create_network()
    for name, (dtype, shape) in token_inputs.items():
        net.add_input(name, dtype, shape)
    pos = net.add_input("position_ids", trt.int64, (-1, -1))
    caches = add_model_caches(
        net, num_layers=1, num_kv_heads=1, head_dim=4, max_seq_len=8, dtype="float32"
    )
    keep = [np.ones((1, 1, 1, 4), np.float32), np.ones((7, 4), np.float32)]
    ones, table = (net.add_constant(a.shape, trt.Weights(a)).get_output(0) for a in keep)
    shuffle = net.add_shuffle(net.add_cast(pos, trt.float32).get_output(0))
    shuffle.reshape_dims = (0, 1, -1, 1)  # [B, 1, S, 1]
    x = net.add_elementwise(shuffle.get_output(0), ones, trt.ElementWiseOperation.PROD)
    k, _ = caches.update(0, x.get_output(0), x.get_output(0))  # [B, 1, S_max, 4]
    reduce = net.add_reduce(k, trt.ReduceOperation.SUM, (1 << 1) | (1 << 2), False)  # [B, 4]
    logits = net.add_matrix_multiply(
        reduce.get_output(0), trt.MatrixOperation.NONE, table, trt.MatrixOperation.TRANSPOSE
    ).get_output(0)
    logits.name = "logits"
    net.mark_output(logits)
    return net, keep


def roles_of(**token_inputs):
    net, _ = network(**token_inputs)
    return decoder_roles(net, decoder_profiles(net, max_batch=3, max_step_tokens=5))


EMBEDS = (trt.float16, (-1, -1, 4))


def test_an_embeddings_network_gets_its_role_map_profiles_and_sidecar():
    from trt_kv.builder.engine import BuiltEngine
    from trt_kv.engine.file import EngineMeta, describe

    net, _ = network(inputs_embeds=EMBEDS)
    profiles = decoder_profiles(net, max_batch=3, max_step_tokens=5)
    assert [p.shapes["inputs_embeds"] for p in profiles] == [
        ((1, 1, 4), (3, 1, 4), (3, 1, 4)),
        ((1, 1, 4), (3, 5, 4), (3, 5, 4)),
    ]
    roles = decoder_roles(net, profiles)
    assert roles.inputs == {
        "embeddings": "inputs_embeds",
        "positions": "position_ids",
        "write_indices": "write_indices",
    }
    assert (roles.embedding_dim, roles.embedding_dtype, roles.token_role) == (
        4,
        "float16",
        "embeddings",
    )
    assert (roles.max_batch, roles.max_step_tokens) == (3, 5)
    assert DecoderRoles.from_json(json.loads(json.dumps(roles.to_json()))) == roles
    meta = describe(net, BuiltEngine(b"x", 0.0), [], {}, roles)
    assert EngineMeta.from_json(json.loads(json.dumps(meta.to_json()))).roles == roles


def test_the_embeddings_axes_are_named_b_and_s_like_token_ids():
    from trt_kv._trt import FEATURES
    from trt_kv.builder.contract import name_dimensions

    if not FEATURES.dimension_names:
        pytest.skip("this TensorRT names no dimensions")
    net, _ = network(inputs_embeds=EMBEDS)
    name_dimensions(net)
    inputs = {t.name: t for t in map(net.get_input, range(net.num_inputs))}
    embeds, pos = inputs["inputs_embeds"], inputs["position_ids"]
    assert [embeds.get_dimension_name(i) for i in range(3)] == ["B", "S", None]
    assert [pos.get_dimension_name(i) for i in range(2)] == ["B", "S"]


def test_a_token_ids_network_records_no_embeddings():
    roles = roles_of(input_ids=(trt.int32, (-1, -1)))
    assert (roles.token_role, roles.embedding_dim, roles.embedding_dtype) == (
        "token_ids",
        None,
        None,
    )


def test_the_embeddings_input_may_have_its_own_name():
    net, _ = network(h=(trt.float32, (-1, -1, 4)))
    names = {"embeddings": "h"}
    profiles = decoder_profiles(net, max_batch=1, max_step_tokens=2, names=names)
    assert profiles[1].shapes["h"] == ((1, 1, 4), (1, 2, 4), (1, 2, 4))
    roles = decoder_roles(net, profiles, names=names)
    assert roles.inputs["embeddings"] == "h" and roles.embedding_dtype == "float32"


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        (
            {"input_ids": (trt.int32, (-1, -1)), "inputs_embeds": EMBEDS},
            NetworkError,
            r"^network inputs: expected exactly one of the roles token_ids or embeddings, "
            r"got \['token_ids', 'embeddings'\]$",
        ),
        (
            {},
            NetworkError,
            r"^network inputs: expected exactly one of the roles token_ids or embeddings, "
            r"got none$",
        ),
        (
            {"inputs_embeds": (trt.int32, (-1, -1, 4))},
            DTypeError,
            r"^inputs_embeds \(role embeddings\): expected dtype float32 or float16 or "
            r"bfloat16, got int32$",
        ),
        (
            {"inputs_embeds": (trt.float32, (-1, -1))},
            ShapeError,
            r"^inputs_embeds \(role embeddings\): expected rank 3, got 2$",
        ),
        (
            {"inputs_embeds": (trt.float32, (-1, -1, -1))},
            ShapeError,
            r"^inputs_embeds \(role embeddings\): expected a static D \(axis 2\), got -1$",
        ),
    ],
    ids=["both", "neither", "int32", "rank-2", "dynamic-D"],
)
def test_a_network_without_exactly_one_good_token_role_is_refused_by_name(inputs, error, message):
    with pytest.raises(error, match=message):
        roles_of(**inputs)


def test_a_role_map_whose_embeddings_differ_from_the_io_is_refused():
    """What an engine loader checks a sidecar's roles with (check_decoder_engine)."""
    from trt_kv.builder.contract import _network_specs

    net, _ = network(inputs_embeds=EMBEDS)
    roles = decoder_roles(net, decoder_profiles(net, max_batch=1, max_step_tokens=2))
    inputs, outputs = _network_specs(net)
    with pytest.raises(
        ShapeError, match=r"^inputs_embeds \(role embeddings\): expected \[B, S, 8\] float16"
    ):
        check_roles(replace(roles, embedding_dim=8), inputs, outputs)
    both = replace(roles, inputs={**roles.inputs, "token_ids": "inputs_embeds"})
    with pytest.raises(NetworkError, match=r"^decoder roles: expected exactly one of the roles"):
        check_roles(both, inputs, outputs)


# -- the runtime -----------------------------------------------------------------------------


def interpreter(embeddings: bool, **kw):
    from trt_kv.runtime.interpreter_backend import InterpreterBackend

    return InterpreterBackend(ALIBI.build(W, 3, 4, embeddings=embeddings), **kw)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The ids and the embeddings engine of the ALiBi decoder (max_batch 3, S <= 4), built in
    this process (the emulator's hook for a network of its own)."""
    from trt_kv.engine.store import build_to_file

    out = tmp_path_factory.mktemp("alibi")
    paths = {}
    for embeddings in (False, True):
        net = ALIBI.build(W, 3, 4, embeddings=embeddings)
        name = f"alibi-{'embeddings' if embeddings else 'ids'}.engine"
        paths[embeddings] = build_to_file(
            net.builder, net.network, net.profiles, out / name, {"model": name}, net.roles
        ).path
    return paths


def _gpu_backend(kind: str):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    return {"tensorrt": TrtBackend, "polygraphy": PolygraphyBackend}[kind]


def make_backend(kind: str, embeddings: bool, engines, **kw):
    if kind == "interpreter":
        return interpreter(embeddings, **kw)
    return _gpu_backend(kind)(engines[embeddings], **kw)


GPU = pytest.mark.gpu
BACKENDS = [
    "interpreter",
    pytest.param("tensorrt", marks=GPU),
    pytest.param("polygraphy", marks=GPU),
]


@pytest.fixture
def engines_if_gpu(request):
    """The engines for a GPU backend's test, nothing for the interpreter's."""
    if request.node.get_closest_marker("gpu") is None:
        return None
    return request.getfixturevalue("engines")


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_backend_of_an_embeddings_network_needs_embed(kind, engines_if_gpu):
    want = r"a function ids \[B, S\] int32 -> \[B, S, 16\] float32 for the embeddings input embeds"
    with pytest.raises(ArgumentError, match=rf"^embed: expected {want}, got None$"):
        make_backend(kind, True, engines_if_gpu)
    with pytest.raises(ArgumentError, match=rf"^embed: expected {want}, got 3$"):
        make_backend(kind, True, engines_if_gpu, embed=3)
    with pytest.raises(
        ArgumentError, match=r"^embed: expected None for a network of token ids \(tokens\), got"
    ):
        make_backend(kind, False, engines_if_gpu, embed=embed)


def _greedy(backend, prompts, lo: int) -> list[list[int]]:
    """NEW greedy ids of ``prompts`` in slots ``lo ..`` (session steps, not generate: its
    slots start at 0)."""
    from trt_kv.runtime import Session

    session = Session(backend)
    logits = session.prefill(prompts, lo)
    out = []
    for _ in range(NEW):
        out.append(np.argmax(logits, -1).astype(np.int32))
        logits = session.decode(out[-1], lo)
    return np.stack(out, 1).tolist()


@pytest.mark.parametrize("kind", BACKENDS)
def test_the_embeddings_network_decodes_the_ids_of_the_ids_network(kind, engines_if_gpu):
    """Same weights, embedding gather in the network or on the host: the same greedy ids,
    batch 1 and 2, in windows at lo 0 and 1, with a chunked prefill (6 tokens, S <= 4)."""
    expected = [ALIBI.numpy_greedy(W, p, NEW) for p in PROMPTS]
    for embeddings, extra in ((False, {}), (True, {"embed": embed})):
        backend = make_backend(kind, embeddings, engines_if_gpu, **extra)
        try:
            for prompts, lo in ((PROMPTS, 0), (PROMPTS, 1), (PROMPTS[1:], 2)):
                got = _greedy(backend, prompts, lo)
                assert got == expected[len(PROMPTS) - len(prompts) :], (embeddings, lo)
        finally:
            getattr(backend, "close", lambda: None)()


BAD_EMBEDDINGS = {
    "shape": (lambda ids: embed(ids)[..., :8], ShapeError, r"expected shape \[2, 1, 16\], got"),
    "dtype": (lambda ids: embed(ids).astype(np.float16), DTypeError, "expected dtype float32"),
    "nan": (
        lambda ids: np.where(ids[..., None] == 7, np.nan, embed(ids)).astype(np.float32),
        ArgumentError,
        r"expected finite values, got 32 NaN or infinite$",
    ),
    "list": (lambda ids: embed(ids).tolist(), DTypeError, "expected a NumPy array, got list"),
}


@pytest.mark.parametrize("bad", sorted(BAD_EMBEDDINGS))
@pytest.mark.parametrize("kind", BACKENDS)
def test_bad_embeddings_are_refused_before_any_slot_changes(kind, bad, engines_if_gpu):
    """A prefill (which resets its slots) or a decode whose embeddings are refused leaves
    every slot's length and cache rows as they were."""
    from trt_kv.runtime import Session

    fn, error, message = BAD_EMBEDDINGS[bad]
    use = {"embed": embed}
    backend = make_backend(kind, True, engines_if_gpu, embed=lambda ids: use["embed"](ids))
    try:
        session = Session(backend)
        session.prefill([[3, 14, 15], [5]])
        before = [(session.length(s), session.snapshot(s)) for s in (0, 1)]
        use["embed"] = fn
        for step in (lambda: session.prefill([[7], [7]]), lambda: session.decode([7, 7])):
            with pytest.raises(error, match=rf"^embed\(ids \[2, 1\]\) for embeds: .*{message}"):
                step()
            after = [(session.length(s), session.snapshot(s)) for s in (0, 1)]
            for (n0, snap0), (n1, snap1) in zip(before, after):
                assert n0 == n1
                assert all(np.array_equal(snap0[k], snap1[k]) for k in snap0)
        use["embed"] = embed  # the session goes on where it was
        expected = [ALIBI.numpy_greedy(W, p, 1) for p in ([3, 14, 15, 7], [5, 7])]
        assert np.argmax(session.decode([7, 7]), -1)[:, None].tolist() == expected
    finally:
        getattr(backend, "close", lambda: None)()


def test_the_staging_of_an_embeddings_engine_holds_b_s_d_floats():
    """The pinned staging was sized as B * S int64 per input: [B, S, D] float32 embeddings
    (D = 16: 64 bytes a token) did not fit (a pinned view past its end)."""
    from trt_kv.runtime.gpu.staging import step_input_bytes

    roles = ALIBI.build(W, 3, 4, embeddings=True).roles
    sizes = step_input_bytes(roles, 3)
    assert sizes == {"embeds": 3 * 4 * 16 * 4, "pos": 96, "rows": 96, "last": 96}
    half = roles_of(inputs_embeds=EMBEDS)  # float16 [B, S, 4], S <= 5
    assert step_input_bytes(half, 2)["inputs_embeds"] == 2 * 5 * 4 * 2
