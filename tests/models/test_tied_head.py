"""``tie_word_embeddings: true`` with an ``lm_head.weight`` of its own stored (GPT-2 and
Llama folders from ``save_pretrained``): transformers 4.57 runs the embedding as the head,
the installed 5.x runs the stored head, so trt_kv refuses the folder by name; a stored head
equal to the embedding is the same model and loads."""

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from tests.support.gpt2_models import save_gpt2
from tests.support.hf_models import save_random_model
from tests.support.tiny_models import TINY_HF_CONFIG
from trt_kv.errors import ConfigError
from trt_kv.models.loading import load_model


def _save_llama(folder):
    config = transformers.LlamaConfig(**{k: v for k, v in TINY_HF_CONFIG.items()})
    return save_random_model(transformers.LlamaForCausalLM, config, folder)


# family -> (save a tied model into a folder, the embedding's stored name, the model class)
FAMILIES = {
    "gpt2": (save_gpt2, "transformer.wte.weight", transformers.GPT2LMHeadModel),
    "llama": (_save_llama, "model.embed_tokens.weight", transformers.LlamaForCausalLM),
}


def _store_head(folder, embedding, head=None):
    """Add ``lm_head.weight`` to the folder's safetensors: ``head``, or a copy of the
    embedding when None. Returns the head stored."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    assert "lm_head.weight" not in tensors  # save_pretrained drops a tied head
    if head is None:
        head = tensors[embedding].copy()
    save_file({**tensors, "lm_head.weight": head}, path, metadata={"format": "pt"})
    return head


def _other_head(shape):
    return np.random.default_rng(7).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_installed_transformers_runs_the_stored_head_not_the_embedding(tmp_path, family):
    save, embedding, model_class = FAMILIES[family]
    model = save(tmp_path)
    head = _store_head(tmp_path, embedding, _other_head(model.lm_head.weight.shape))
    loaded = model_class.from_pretrained(tmp_path).eval()
    assert transformers.__version__.startswith("5.")
    np.testing.assert_array_equal(loaded.lm_head.weight.detach().numpy(), head)
    with torch.no_grad():
        ids = torch.tensor([[3, 1, 4]])
        assert not torch.allclose(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_stored_head_other_than_the_tied_embedding_is_refused_by_name(tmp_path, family):
    save, embedding, _ = FAMILIES[family]
    model = save(tmp_path)
    _store_head(tmp_path, embedding, _other_head(model.lm_head.weight.shape))
    short = embedding.removeprefix("transformer.")
    with pytest.raises(
        ConfigError,
        match=rf"^lm_head\.weight: expected absent or equal to {short} .*tie_word_embeddings "
        r"is true.*got a different head, which transformers 4 ignores \(tied\) and "
        "transformers 5 uses",
    ):
        load_model(tmp_path, progress=False)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_stored_head_equal_to_the_embedding_loads(tmp_path, family):
    save, embedding, _ = FAMILIES[family]
    save(tmp_path)
    _store_head(tmp_path, embedding)
    assert load_model(tmp_path, progress=False).config.vocab_size > 0
