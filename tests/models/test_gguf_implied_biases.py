"""Two tables, one fact each: the GGUF reader's implied biases (the bias tensors a qwen2 file
holds with no ``attention_bias`` key) and the family's (Qwen2 always has q/k/v biases). They
must agree. (The import rules that moved them apart are pyproject.toml's layers contracts.)"""

from trt_kv.checkpoints.gguf_archs import ARCHITECTURES
from trt_kv.models.family import family_of


def test_gguf_implied_biases_are_those_the_family_always_has():
    for name, arch in ARCHITECTURES.items():
        for model_type in {arch.model_type, arch.window_model_type} - {None}:
            always = {"q_proj", "k_proj", "v_proj"} if family_of(model_type).qkv_bias else set()
            assert arch.implied_biases == always, (name, model_type)
