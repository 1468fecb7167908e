"""Routes of the decoder network: which TensorRT parts build attention, RoPE and the cache
update, chosen from the module's features, forced by ``Routes(...)``, recorded in the sidecar.

Every route combination TensorRT-RTX can build is built into a real engine on the CPU, and
the same network, run on the interpreter, generates the ids of the NumPy reference and of
Hugging Face ``generate``. The features of other TensorRT versions are given as data
(``FEATURES._replace(...)``) to the same route chooser the builder calls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import transformers

from tests.support.hf_models import greedy_ids, hf_config_args, save_random_model
from tests.support.tiny_models import TINY_GQA
from trt_kv._trt import FEATURES
from trt_kv.builder import Routes, resolve_routes
from trt_kv.engine.file import sidecar_path
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import NetworkError, RouteError
from trt_kv.models.llama import LlamaConfig, build_llama_network, load_hf_weights, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

# What each TensorRT offers (the chooser reads features, never these version strings).
RTX = FEATURES._replace(
    module="tensorrt_rtx",
    version="1.7.1",
    attention_v2=True,
    attention=True,
    attention_kv_lengths=True,
    rotary_embedding=True,
    kv_cache_update_layer=True,
    python_plugins=False,
)
TRT_11 = RTX._replace(module="tensorrt", version="11.0", python_plugins=True)
TRT_10_15 = TRT_11._replace(version="10.15.1", attention_v2=False, attention_kv_lengths=False)
TRT_10_14 = TRT_10_15._replace(
    version="10.14.1", rotary_embedding=False, kv_cache_update_layer=False
)
TRT_10_3 = TRT_10_14._replace(version="10.3.0", attention=False)
TRT_8_6 = TRT_10_3._replace(version="8.6.1", python_plugins=False)


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (RTX, ("attention_v2", "rotary_layer", "layer")),
        (TRT_11, ("attention_v2", "rotary_layer", "layer")),
        (TRT_10_15, ("attention", "rotary_layer", "layer")),
        (TRT_10_14, ("attention", "elementwise", "plugin")),
        (TRT_10_3, ("primitive", "elementwise", "plugin")),
    ],
    ids=["rtx-1.7", "trt-11", "trt-10.15", "trt-10.14", "trt-10.3"],
)
def test_auto_takes_the_best_route_the_features_offer(features, expected):
    chosen = resolve_routes(Routes(), features)
    assert (chosen.attention, chosen.rope, chosen.cache_update) == expected
    assert chosen.key_value_lengths is False


ROUTES_DOC = Path(__file__).resolve().parents[2] / "docs" / "routes.md"
# the table's row label -> the features of the versions it names
TABLE_ROWS = {
    "11.x, TensorRT-RTX 1.7": (TRT_11, RTX),
    "10.15.1 and later 10.x": (TRT_10_15,),
    "10.14": (TRT_10_14,),
    "10.0 - 10.13 (JetPack 6: 10.3)": (TRT_10_3,),
    "< 10.0": (TRT_8_6,),
}


def _documented_route_table() -> dict[str, list[str]]:
    """Row label -> the cells of docs/routes.md's "TensorRT version -> route" table."""
    lines = ROUTES_DOC.read_text().splitlines()
    start = lines.index(
        "| TensorRT | attention | RoPE | cache update | `key_value_lengths` option |"
    )
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        label, *cells = (c.strip() for c in line.strip("|").split("|"))
        rows[label] = cells
    return rows


def _first_code(cell: str) -> str | None:
    found = re.match(r"`(\w+)`", cell)
    return found.group(1) if found else None


def test_the_documented_route_table_is_what_the_chooser_picks():
    table = _documented_route_table()
    assert set(table) == set(TABLE_ROWS)
    for label, (attention, rope, cache_update, lengths) in table.items():
        for features in TABLE_ROWS[label]:
            if cache_update.startswith("none"):  # fails closed; the other parts as chosen
                with pytest.raises(RouteError, match=re.escape("routes.cache_update")):
                    resolve_routes(Routes(), features)
                features = features._replace(python_plugins=True)
            chosen = resolve_routes(Routes(), features)
            assert chosen.attention == _first_code(attention), label
            assert chosen.rope == _first_code(rope), label
            if _first_code(cache_update) is not None:
                assert chosen.cache_update == _first_code(cache_update), label
            if lengths == "yes":
                assert resolve_routes(Routes(key_value_lengths=True), features).key_value_lengths
            else:
                with pytest.raises(RouteError, match="key_value_lengths"):
                    resolve_routes(Routes(key_value_lengths=True), features)


def test_no_cache_update_route_fails_closed_with_each_reason():
    with pytest.raises(RouteError) as err:
        resolve_routes(Routes(), TRT_8_6)
    assert str(err.value) == (
        "routes.cache_update: expected a route the installed TensorRT has, got "
        "layer: tensorrt 8.6.1 has no INetworkDefinition.add_kv_cache_update; "
        "plugin: tensorrt 8.6.1 has no INetworkDefinition.add_plugin_v3"
    )
    assert isinstance(err.value, NetworkError)


def test_forced_route_the_features_lack_names_the_missing_call():
    with pytest.raises(RouteError, match=re.escape("tensorrt 10.15.1 has no INetworkDefinition")):
        resolve_routes(Routes(attention="attention_v2"), TRT_10_15)


def test_unknown_route_name_is_refused():
    with pytest.raises(RouteError, match=re.escape("routes.rope: expected one of")):
        resolve_routes(Routes(rope="rotary"), RTX)


def test_key_value_lengths_needs_a_fused_attention_with_lengths():
    with pytest.raises(RouteError, match=r"routes\.key_value_lengths: expected a fused attention"):
        resolve_routes(Routes(attention="primitive", key_value_lengths=True), RTX)
    with pytest.raises(RouteError, match=re.escape("tensorrt 10.15.1 has none")):
        resolve_routes(Routes(key_value_lengths=True), TRT_10_15)


def test_forced_routes_are_kept_where_the_features_allow_them():
    forced = Routes("primitive", "elementwise", "plugin", False)
    assert resolve_routes(forced, TRT_11) == forced


def test_plugin_route_fails_closed_on_tensorrt_rtx_before_building():
    if FEATURES.python_plugins:
        pytest.skip(f"{FEATURES.module} has add_plugin_v3: the plugin route builds here")
    with pytest.raises(RouteError) as err:
        build_llama_network(TINY, random_weights(TINY), routes=Routes(cache_update="plugin"))
    assert str(err.value) == (
        f"routes.cache_update: expected route 'plugin', got plugin: {FEATURES.module} "
        f"{FEATURES.version} has no INetworkDefinition.add_plugin_v3"
    )


# -- every buildable combination, end to end ------------------------------------------------

TINY = TINY_GQA
PROMPTS = [[5, 17, 3, 42, 7, 9], [60, 1, 33]]  # ragged: the second is right-padded
NEW_TOKENS = 8
S_MAX, MAX_STEP = 32, 8


def _route_id(r: Routes) -> str:
    return f"{r.attention}-{r.rope}" + ("-lengths" if r.key_value_lengths else "")


COMBINATIONS = [
    Routes(attention, rope, "layer", lengths)
    for attention in ("attention_v2", "attention", "primitive")
    for rope in ("rotary_layer", "elementwise")
    for lengths in (False, True)
    if not (lengths and attention == "primitive")
]


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """``(config, weights, Hugging Face greedy ids)`` of a saved random Llama."""
    hf_config = transformers.LlamaConfig(
        **hf_config_args(TINY, initializer_range=0.3, tie_word_embeddings=False)
    )
    folder = tmp_path_factory.mktemp("hf_llama")
    model = save_random_model(transformers.LlamaForCausalLM, hf_config, folder)
    config = LlamaConfig.from_hf(folder)
    return config, load_hf_weights(folder, config), greedy_ids(model, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize(
    "routes",
    COMBINATIONS,
    ids=[_route_id(r) for r in COMBINATIONS],
)
def test_route_builds_an_engine_and_generates_the_reference_and_hf_ids(
    routes, hf_checkpoint, tmp_path
):
    config, weights, hf_ids = hf_checkpoint
    shape = dict(max_seq_len=S_MAX, max_batch=2, max_step_tokens=MAX_STEP)
    built = build_model_engine(
        "tiny", config, weights, out_dir=tmp_path, dtype="float16", routes=routes, **shape
    )
    assert json.loads(sidecar_path(built.path).read_text())["metadata"]["routes"] == {
        "attention": routes.attention,
        "rope": routes.rope,
        "cache_update": "layer",
        "key_value_lengths": routes.key_value_lengths,
    }
    net = build_llama_network(config, weights, dtype="float32", routes=routes, **shape)
    inputs = {net.network.get_input(i).name for i in range(net.network.num_inputs)}
    assert ("key_value_lengths" in inputs) == routes.key_value_lengths
    ours = generate(Session(InterpreterBackend(net)), PROMPTS, NEW_TOKENS).ids
    reference = ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX)
    assert ours == generate(Session(reference), PROMPTS, NEW_TOKENS).ids == hf_ids


def test_primitive_route_never_reads_cache_rows_no_query_sees(hf_checkpoint):
    """Unwritten rows hold NaN: the masked softmax gives them weight 0 and V is zeroed there,
    so no NaN reaches the logits (0 * NaN would)."""
    config, weights, _ = hf_checkpoint
    net = build_llama_network(
        config,
        weights,
        max_seq_len=S_MAX,
        max_batch=2,
        max_step_tokens=MAX_STEP,
        dtype="float32",
        routes=Routes(attention="primitive"),
    )
    session = Session(InterpreterBackend(net))
    for array in session.storage.arrays.values():
        array[...] = np.nan
    logits = session.step(PROMPTS)  # no prefill: prefill would zero the slots first
    assert np.isfinite(logits).all()
    fresh = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    np.testing.assert_allclose(logits, fresh.prefill(PROMPTS), rtol=0, atol=1e-4)
