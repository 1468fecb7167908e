"""A checkpoint whose ``config.json`` ties the LM head to the embedding
(``tie_word_embeddings: true``) but stores an ``lm_head.weight`` of its own.

Which head runs depends on the transformers version (checked on such a ``save_pretrained``
folder of GPT-2 and of Llama): 4.57 ties the head to the embedding and drops the stored one;
5.24 keeps the stored head untied ("both are present in the checkpoints with different
values, so we will NOT tie them"). trt_kv would have to pick one, and either differs from one
of them: such a checkpoint is refused by name. A stored head equal to the embedding is the
same model either way, and passes.
"""

from __future__ import annotations

import numpy as np

from trt_kv.errors import ConfigError, mismatch

HEAD = "lm_head.weight"


def check_tied_head(tensors: dict[str, np.ndarray], embedding: str) -> None:
    """Refuse a stored ``lm_head.weight`` other than ``tensors[embedding]`` in a checkpoint
    whose head is tied to that embedding (call it only for a tied config).

    Raises:
        ConfigError: naming ``lm_head.weight``, the embedding, and what transformers 4 and 5
            each do with it.
    """
    head = tensors.get(HEAD)
    if head is None or embedding not in tensors:
        return
    stored = tensors[embedding]
    if head.shape == stored.shape and np.array_equal(head, stored):
        return
    raise ConfigError(
        mismatch(
            HEAD,
            f"absent or equal to {embedding} (config.json ties the head: tie_word_embeddings "
            "is true)",
            "",
            "a different head, which transformers 4 ignores (tied) and transformers 5 uses; "
            "set tie_word_embeddings to false to run this head, or remove it to run the "
            "embedding",
        )
    )
