"""An engine built by another process runs on the emulated GPU when the caller passes the
function that rebuilds its sidecar's recipe (``emulated_gpu(rebuild=...)``; trt_kv's is
``recipe_rebuilder(models)``), and is refused, saying what to pass, without one: the
emulator itself loads no models."""

import hashlib
import json

import pytest

from tests.support.cli_user import run_cli, write_tiny_model
from trt_kv._trt import logger, trt
from trt_kv.emulator import emulated_gpu
from trt_kv.engine.recipes import recipe_rebuilder
from trt_kv.runtime import Session, generate
from trt_kv.runtime.gpu.trt_backend import TrtBackend

SHAPES = ["--max-seq-len", "16", "--max-batch", "1", "--max-step-tokens", "4"]
PROMPT = "5,17,42"


def refusal(engine) -> str:
    """What the emulated TensorRT logs when it refuses to deserialize ``engine`` (raises
    AssertionError when it does not refuse)."""
    assert trt.Runtime(logger()).deserialize_cuda_engine(engine.read_bytes()) is None
    return logger().last_error


@pytest.fixture(autouse=True)
def no_network_known(monkeypatch):
    """The emulator remembers every network it rebuilt for the rest of the process: each
    test starts knowing none."""
    from trt_kv.emulator import engines

    monkeypatch.setattr(engines, "_RECORDS", {})


@pytest.fixture(scope="module")
def built_elsewhere(tmp_path_factory):
    """``(model folder, engine file)``: ``trt-kv build`` in a subprocess, float32."""
    tmp = tmp_path_factory.mktemp("elsewhere")
    folder = write_tiny_model(tmp / "tiny")
    run_cli("build", "--model", folder, "--out", tmp, "--dtype", "float32", *SHAPES, "-q")
    (engine,) = tmp.glob("tiny-*.engine")
    return folder, engine


def test_it_runs_given_the_recipe_rebuilder_of_its_model(built_elsewhere):
    folder, engine = built_elsewhere
    reference = run_cli(
        "generate", "--model", folder, "--backend", "reference", "--prompt-ids", PROMPT,
        "--max-new-tokens", "4", "--json", *SHAPES,
    )  # fmt: skip
    with emulated_gpu(engines=[engine], rebuild=recipe_rebuilder([folder])):
        backend = TrtBackend(engine)
        ids = generate(Session(backend), [[5, 17, 42]], max_new_tokens=4).ids
        backend.close()
    assert ids == json.loads(reference.stdout)["ids"]


def test_without_a_rebuild_function_it_is_refused_by_name(built_elsewhere):
    _, engine = built_elsewhere
    sha = hashlib.sha256(engine.read_bytes()).hexdigest()
    with emulated_gpu(engines=[engine]):
        message = refusal(engine)
    assert message == (
        f"[emulated TensorRT] deserialize_cuda_engine: engine sha256 {sha[:16]}: "
        "recipe 'llama' (an engine built in another process): expected "
        "emulated_gpu(rebuild=fn) to rebuild its network, e.g. rebuild="
        "trt_kv.engine.recipes.recipe_rebuilder([model specs]), got no rebuild function"
    )


def test_a_rebuilder_without_its_model_is_refused_naming_the_weights(built_elsewhere):
    _, engine = built_elsewhere
    recipe = json.loads(engine.with_name(engine.name + ".json").read_text())["metadata"]["recipe"]
    with emulated_gpu(engines=[engine], rebuild=recipe_rebuilder()):
        message = refusal(engine)
    assert message.endswith(
        ": recipe 'llama': recipe of model 'tiny': expected a model given to "
        f"recipe_rebuilder([...]) with weights sha256 {recipe['weights_sha256'][:12]}, got no "
        "models given"
    )
