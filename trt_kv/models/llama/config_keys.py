"""Which ``config.json`` keys trt_kv accepts, reads, or refuses, decided from transformers'
``LlamaConfig``, ``PreTrainedConfig`` and ``modeling_llama.py`` (5.x), with the cache and
mask utilities (which switch on a sliding window or chunked attention from the config).

``ACCEPTED`` keys do not change the network; ``IMPLEMENTED`` ones are read into
:class:`~trt_kv.models.llama.LlamaConfig` (the family switches' keys by
:mod:`trt_kv.models.family`, which refuses the values a family does not build);
``REFUSED_UNLESS`` keys change the network and no family builds them. Any other key (and a
family's own keys, :attr:`Family.keys`, for other families) is refused.
"""

from __future__ import annotations

# Keys that do not change the network. Bookkeeping written by save_pretrained and the hub;
# token ids (generation reads EOS from generation_config.json / config.json); settings used
# only in training (dropout, initializer_range, gradient checkpointing); output switches;
# generation defaults older transformers stored in config.json; and keys modeling_llama.py
# never reads: pretraining_tp (transformers < 4.45 split each matmul into that many slices
# and summed them, the same product), rope_interleaved and is_llama_config (nanotron's).
ACCEPTED = frozenset(
    {
        "_name_or_path",
        "_model_name_or_path",
        "_commit_hash",
        "_attn_implementation_autoset",
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "use_cache",
        "initializer_range",
        "attention_dropout",
        "hidden_dropout",
        "gradient_checkpointing",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "chunk_size_feed_forward",
        "pruned_heads",
        "tf_legacy_loss",
        "is_decoder",
        "is_encoder_decoder",
        "add_cross_attention",
        "tie_encoder_decoder",
        "cross_attention_hidden_size",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "pretraining_tp",
        "rope_interleaved",
        "is_llama_config",
    }
)

REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
# Sizes that must be integers > 0.
SIZES = (*REQUIRED, "num_key_value_heads", "head_dim", "max_position_embeddings")
# Keys read into LlamaConfig (their values are checked); the switches' keys are read (and
# refused at values a family does not build) by trt_kv.models.family.
IMPLEMENTED = frozenset(
    {
        *SIZES,
        "rms_norm_eps",
        "rope_theta",
        "rope_parameters",
        "rope_scaling",
        "tie_word_embeddings",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
        "sliding_window",
        "layer_types",
    }
)

# Keys that change the network and no family builds: key -> (is the value the one built
# here?, what is built).
REFUSED_UNLESS = {
    "attention_chunk_size": (lambda v: v is None, "null (no chunked attention)"),
    "quantization_config": (lambda v: False, "no quantization (float weights)"),
}
