"""A request made into what the scheduler takes: prompt ids (a chat through the model's
template, a completion's text through its tokenizer, or ids as given) and
:class:`~trt_kv.serve.scheduler.SamplingParams`; the scheduler's refusals made into OpenAI's
errors (400 naming the field or the limit, 429 with ``Retry-After``, 503 while draining)."""

from __future__ import annotations

from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.errors import DrainingError, LimitError, QueueFullError, TrtKvError
from trt_kv.serve.http.errors import ApiError, bad_request
from trt_kv.serve.http.protocol import ChatCompletionRequest, CompletionRequest, Request
from trt_kv.serve.scheduler import EngineLoop, SamplingParams, Ticket

RETRY_AFTER_S = 1  # a full queue: when to try again (a slot frees every few steps)


def chat_prompt(request: ChatCompletionRequest, tokenizer: TextTokenizer | None) -> list[int]:
    """The messages in the model's chat template, as ``trt-kv generate --chat`` renders them.
    Raises ApiError 400 (``messages``) for a model without tokenizer or template."""
    if tokenizer is None or not tokenizer.chat_template:
        raise bad_request(
            "messages", "messages: this model has no chat template; use /v1/completions"
        )
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    try:
        return tokenizer.encode_chat(messages)
    except TrtKvError as e:
        raise bad_request("messages", f"messages: {e}") from None


def completion_prompt(request: CompletionRequest, tokenizer: TextTokenizer | None) -> list[int]:
    """A text prompt's ids (BOS as the model adds it, as ``trt-kv generate --no-chat``), or
    the ids given. Raises ApiError 400 (``prompt``): text without a tokenizer, or no token."""
    if isinstance(request.prompt, list):
        return list(request.prompt)
    if tokenizer is None:
        raise bad_request("prompt", "prompt: this model has no tokenizer; send token ids")
    ids = tokenizer.encode(request.prompt)
    if not ids:
        raise bad_request(
            "prompt", f"prompt: expected text with at least one token, got {request.prompt!r}"
        )
    return ids


def sampling_params(request: Request, prompt_tokens: int, max_seq_len: int) -> SamplingParams:
    """The request's sampling; ``max_tokens`` left out is what fits: ``S_max - prompt``.
    Raises ApiError 400 (``max_tokens``, code ``context_length_exceeded``) when the prompt
    leaves no room."""
    limit = request.token_limit()
    if limit is None:
        limit = max_seq_len - prompt_tokens
        if limit < 1:
            raise too_long(prompt_tokens, 1, max_seq_len)
    top = request.top_count()
    return SamplingParams(
        max_tokens=limit,
        temperature=request.temperature,
        top_p=request.top_p if request.temperature else 1.0,  # greedy ignores them, as OpenAI
        top_k=request.top_k if request.temperature else None,
        seed=request.seed,
        repetition_penalty=request.repetition_penalty,
        frequency_penalty=request.frequency_penalty,
        presence_penalty=request.presence_penalty,
        top_logprobs=top,
        n=request.n,
        ignore_eos=request.ignore_eos,
    )


def too_long(prompt_tokens: int, max_tokens: int, max_seq_len: int) -> ApiError:
    """400: the prompt and ``max_tokens`` exceed ``S_max``, every number said."""
    return ApiError(
        400,
        f"max_tokens: expected prompt tokens + max_tokens <= S_max = {max_seq_len} (this "
        f"server's context length), got {prompt_tokens} + {max_tokens} = "
        f"{prompt_tokens + max_tokens}",
        param="max_tokens",
        code="context_length_exceeded",
    )


def submit(loop: EngineLoop, prompt: list[int], params: SamplingParams) -> Ticket:
    """``loop.submit``, its refusals as ApiError: 400 (the limit, or the field an
    ArgumentError names), 429 with ``Retry-After`` (full queue), 503 (draining)."""
    try:
        return loop.submit(prompt, params)
    except LimitError:
        raise too_long(len(prompt), params.max_tokens, loop.scheduler.max_seq_len) from None
    except QueueFullError as e:
        raise ApiError(
            429, f"the request queue is full ({e}); retry after {RETRY_AFTER_S} s",
            type="rate_limit_exceeded", code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None  # fmt: skip
    except DrainingError:
        raise ApiError(
            503, "the server is shutting down", type="server_error", code="shutting_down"
        ) from None
    except TrtKvError as e:  # ArgumentError: "<field>: expected ..., got ..."
        field = str(e).split(":", 1)[0]
        raise bad_request(field if field.isidentifier() else None, str(e)) from None
