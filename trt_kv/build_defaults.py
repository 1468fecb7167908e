"""Every default, defined once: the size of every model engine and network, and how many
tokens each command generates. The network builder
(:func:`trt_kv.models.llama.build_llama_network`), the engine store
(:class:`trt_kv.engine.store.BuildOptions`), the runtime's
:class:`~trt_kv.runtime.cache_state.CacheState`, the reference backends, the command line and
the docs read them from here. Imports nothing (``trt-kv --help`` reads it).

``MAX_STEP_TOKENS`` = 128: the widest step, fixed whatever the prompts, so one engine per model
and options serves every prompt (a longer prompt is prefilled in chunks of 128, up to S_max,
with the ids of one wide prefill). 128 holds a chat question in the default model's template
(~40 tokens) in one step; it is the prefill width the CPU interpreter's products are tuned and
benchmarked at (``1 x 128``); its activations stay small (``[8, 128, 1536]`` float32, ~6 MB,
the widest of the default model); wider steps save a few chunk boundaries per long prompt.
``MAX_SEQ_LEN`` = 512: room for a few chat turns (history is prefilled again each turn).
"""

from __future__ import annotations

DTYPE = "float16"  # weights and activations of engines and the interpreter
MAX_SEQ_LEN = 512  # S_max of every cache
MAX_BATCH = 8  # most sequences per step
MAX_STEP_TOKENS = 128  # most tokens per sequence in one step (longer prompts: chunks)
# candidates the network itself picks for the next token (a TopK layer after the logits):
# 0 off (the logits only), 1 greedy (``next_token [B]``: a greedy GPU step downloads 4 * B
# bytes, not the [B, V] logits), k > 1 the k best ids and logits. Builds with all_logits
# (the logits of every position) take 0 (see default_device_top_k).
DEVICE_TOP_K = 1


def default_device_top_k(all_logits: bool) -> int:
    """``device_top_k`` when none is given: :data:`DEVICE_TOP_K`, or 0 with ``all_logits``
    (which has no sampling outputs; an explicit k >= 1 with it is refused)."""
    return 0 if all_logits else DEVICE_TOP_K


# tokens a command generates when --max-new-tokens is not given (generate and chat: at most
# what fits S_max)
MAX_NEW_TOKENS_GENERATE_IDS = 8  # generate --prompt-ids, per prompt
MAX_NEW_TOKENS_GENERATE_TEXT = 64  # generate --prompt, per prompt
MAX_NEW_TOKENS_DEMO = 24  # demo, per prompt
MAX_NEW_TOKENS_CHAT = 256  # chat, per answer


def default_step_tokens(max_seq_len: int) -> int:
    """``max_step_tokens`` when none is given: ``min(MAX_STEP_TOKENS, max_seq_len)``."""
    return min(MAX_STEP_TOKENS, max_seq_len)


# the server (trt_kv.serve): requests that may wait for a slot before more are refused (429),
# and the prompt tokens one prefill chunk feeds per step boundary, between the running
# sequences' decode steps: 128, where a prompt token costs least on the interpreter (default
# model, float16: 24.9 ms a token at 128, 40 at 64, 37 at 256; scripts/bench_serve_steps.py,
# docs/decisions.md "the server's scheduler"), and MAX_STEP_TOKENS (capped to an engine's)
MAX_QUEUE = 64
PREFILL_CHUNK = 128
# trt-kv serve's drain: seconds the requests in flight get after SIGTERM or Ctrl-C
DRAIN_TIMEOUT_S = 30.0
