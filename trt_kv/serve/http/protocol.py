"""OpenAI's request and response shapes, typed once (pydantic): what ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/models`` take and give, as the official ``openai`` client
sends and reads them. Unknown request fields are ignored, as OpenAI does; a field of the
wrong type or range fails validation, which the app answers with 400 naming the field
(:mod:`trt_kv.serve.http.errors`). Extensions beyond OpenAI's fields: ``top_k``,
``repetition_penalty`` and ``ignore_eos`` (as vLLM and llama-server take them).
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4  # OpenAI's most stop strings
MAX_TOP_LOGPROBS_CHAT = 20  # OpenAI's top_logprobs range: 0..20
MAX_LOGPROBS_COMPLETION = 5  # OpenAI's completions logprobs range: 0..5
MIN_TEMPERATURE = 1e-3  # below it (but 0, greedy) the sampler's logits / T overflow


class Request(BaseModel):
    """Fields every generation request shares; unknown fields ignored, known ones of
    another JSON type refused (strict: ``"stream": "yes"`` is no bool)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=1)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = Field(
        default=None, validate_default=True
    )
    n: Annotated[int, Field(ge=1)] = 1
    repetition_penalty: Annotated[float, Field(ge=1e-3, le=1e3)] = 1.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float) -> float:
        if 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"expected 0 (greedy) or at least {MIN_TEMPERATURE:g}")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or ())
        if any(not s for s in stops):
            raise ValueError("expected non-empty strings")
        return stops

    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
        return bool(self.stream_options and self.stream_options.include_usage)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; ``content`` a string or a list of text parts (joined)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(Request):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS_CHAT)] | None = None

    def token_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens`` (its deprecated name), else None."""
        return self.max_completion_tokens or self.max_tokens

    def top_count(self) -> int | None:
        """The alternatives per token asked for: None without ``logprobs``."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Request):
    """``POST /v1/completions``: ``prompt`` a text or its token ids."""

    prompt: str | Annotated[list[int], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS_COMPLETION)] | None = None
    echo: Literal[False] = False

    def token_limit(self) -> int | None:
        return self.max_tokens

    def top_count(self) -> int | None:
        return self.logprobs


Request.model_rebuild()


# -- responses -------------------------------------------------------------------------------
class Response(BaseModel):
    """Responses serialize every field, None as null, as OpenAI does."""


class PromptTokensDetails(Response):
    cached_tokens: int = 0


class Usage(Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class TopLogprob(Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(Response):
    content: list[TokenLogprob] | None = None


class CompletionLogprobs(Response):
    """The completions API's older shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class AssistantMessage(Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class Delta(Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChoice(Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatChunkChoice(Response):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class CompletionChoice(Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


def _created() -> int:
    return int(time.time())


class _Reply(Response):
    """What every completion and chunk carries besides its ``object`` and ``choices``."""

    id: str
    created: int = Field(default_factory=_created)
    model: str
    usage: Usage | None = None


class ChatCompletion(_Reply):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ChatCompletionChunk(_Reply):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class Completion(_Reply):
    """A whole completion, and each chunk of a streamed one (OpenAI uses one shape)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ModelCard(Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_created)
    owned_by: str = "trt_kv"


class ModelList(Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Response):
    """``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail
