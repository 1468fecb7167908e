"""``--routes`` on the command line: the documented workaround (primitive attention, say) as a
user forces it, named in the engine file and the sidecar, and refused with one line when the
route is unknown or missing."""

from __future__ import annotations

import json

import pytest

from tests.support.cli_user import run_cli, write_tiny_model
from trt_kv._trt import FEATURES
from trt_kv.builder import Routes
from trt_kv.engine.file import sidecar_path
from trt_kv.errors import RouteError

SHAPE = ("--max-seq-len", "32", "--max-batch", "2", "--max-step-tokens", "8")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def test_routes_text_parses_into_routes():
    assert Routes.parse("attention=primitive, rope=elementwise,key_value_lengths") == Routes(
        "primitive", "elementwise", "auto", True
    )
    assert Routes.parse("key_value_lengths=false") == Routes()


@pytest.mark.parametrize(
    "text", ["colour=red", "attention", "attention=primitive,attention=attention", ""]
)
def test_malformed_routes_text_is_refused(text):
    with pytest.raises(RouteError, match="routes: expected"):
        Routes.parse(text)


def test_build_with_forced_routes_names_them_in_the_file_and_the_sidecar(model, tmp_path):
    routes = "attention=primitive,rope=elementwise"
    run_cli("build", "--model", model, "--out", tmp_path, *SHAPE, "--routes", routes, "-q")
    (engine,) = tmp_path.glob(
        "tiny-*-float16-s32-b2-t8-attention_primitive.rope_elementwise-k1.engine"
    )
    sidecar = json.loads(sidecar_path(engine).read_text())
    assert sidecar["metadata"]["routes"] == {
        "attention": "primitive",
        "rope": "elementwise",
        "cache_update": "layer",
        "key_value_lengths": False,
    }


def test_generate_on_forced_routes_gives_the_reference_ids(model):
    def ids(*extra):
        args = ("generate", "--model", model, "--prompt-ids", "5,17,3;9,2", *SHAPE, "--json")
        out = run_cli(*args, "--max-new-tokens", "5", *extra).stdout
        return json.loads(out)["ids"]

    # float32: in float16 this prompt's 3rd token is a near tie (logits 3.142 vs 3.137)
    routes = ("--routes", "attention=primitive,rope=elementwise", "--dtype", "float32")
    assert ids("--backend", "interpreter", *routes) == ids("--backend", "reference")


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ("attention=fused", "routes.attention: expected one of ('auto', 'attention_v2'"),
        ("colour=red", "routes: expected items attention=ROUTE"),
    ],
)
def test_bad_routes_are_one_error_line_and_exit_2(model, tmp_path, routes, message):
    out = run_cli("build", "--model", model, "--out", tmp_path, "--routes", routes, check=False)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_a_route_the_installed_tensorrt_lacks_is_one_error_line(model, tmp_path):
    if FEATURES.python_plugins:
        pytest.skip(f"{FEATURES.module} has add_plugin_v3")
    out = run_cli(
        "build", "--model", model, "--out", tmp_path, "--routes", "cache_update=plugin", check=False
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        f"trt-kv: error: routes.cache_update: expected route 'plugin', got plugin: "
        f"{FEATURES.module} {FEATURES.version} has no INetworkDefinition.add_plugin_v3"
    )
