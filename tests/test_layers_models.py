"""Each model whole under ``trt_kv.models`` (issue 38): the checkpoint readers and the NumPy
ops import no model, and GPT-2 imports nothing of Llama (what they share is in
``trt_kv.models.layers``). Read from the import graph (grimp), indirect imports included."""

import grimp
import pytest

from trt_kv.checkpoints.gguf_archs import ARCHITECTURES
from trt_kv.models.family import family_of


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("trt_kv")


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("trt_kv.checkpoints", "trt_kv.models"),
        ("trt_kv.reference", "trt_kv.models"),
        ("trt_kv.models.gpt2", "trt_kv.models.llama"),
        ("trt_kv.models.llama", "trt_kv.models.gpt2"),
        ("trt_kv.models.layers", "trt_kv.models.llama"),
        ("trt_kv.models.layers", "trt_kv.models.gpt2"),
    ],
)
def test_package_imports_nothing_of(graph, importer, imported):
    chain = graph.find_shortest_chain(importer=importer, imported=imported, as_packages=True)
    assert chain is None, " -> ".join(chain)


def test_gguf_implied_biases_are_those_the_family_always_has():
    # Two tables, one fact each: the GGUF reader's (bias tensors a qwen2 file holds with no
    # attention_bias key) and the family's (Qwen2 always has q/k/v biases). They must agree.
    for name, arch in ARCHITECTURES.items():
        for model_type in {arch.model_type, arch.window_model_type} - {None}:
            always = {"q_proj", "k_proj", "v_proj"} if family_of(model_type).qkv_bias else set()
            assert arch.implied_biases == always, (name, model_type)
