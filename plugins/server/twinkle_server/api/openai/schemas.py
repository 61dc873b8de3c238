"""Request and response bodies of the OpenAI-compatible routes (the subset docs/openai.md lists).

Requests are validated strictly from JSON (a string where a number belongs is a 400, as OpenAI answers); fields
this server does not know are ignored, fields it knows but cannot serve are refused by the router with the field
named (`param`). Responses follow OpenAI's objects field by field, so the official client parses them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: OpenAI's ceiling for top_logprobs (chat) and logprobs (completions, where OpenAI stops at 5)
MAX_TOP_LOGPROBS = 20
#: stop sequences one request may give
MAX_STOP = 16


class _Request(BaseModel):
    model_config = ConfigDict(extra='ignore', strict=True)


# ---- requests ---------------------------------------------------------------------------------------------------
class StreamOptions(_Request):
    include_usage: bool = False


class FunctionCall(_Request):
    name: str
    arguments: str = '{}'


class ToolCall(_Request):
    id: str = ''
    type: Literal['function'] = 'function'
    function: FunctionCall


class ChatMessage(_Request):
    """One message. `content`: text, or a list of parts (only ``{"type": "text", "text": ...}`` parts are served)."""

    role: Literal['system', 'developer', 'user', 'assistant', 'tool']
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal['function'] = 'function'
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal['function'] = 'function'
    function: NamedFunction


class SamplingFields(_Request):
    """What both endpoints share. `top_k` is an extension (as in vLLM); the penalties and `logit_bias` are accepted
    only at their neutral values."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal['none', 'auto', 'required'] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    #: extension (as in vLLM): extra variables for the model's chat template, e.g. ``{"enable_thinking": false}``
    chat_template_kwargs: dict[str, Any] | None = None
    #: extension: record this call in a rollout session (as the ``X-Rollout-Session`` header does)
    rollout_session: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


# ---- responses --------------------------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class ResponseFunction(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal['function'] = 'function'
    function: ResponseFunction


class AssistantMessage(BaseModel):
    role: Literal['assistant'] = 'assistant'
    content: str | None
    refusal: None = None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: Literal['stop', 'length', 'tool_calls']


class ChatCompletion(BaseModel):
    id: str
    object: Literal['chat.completion'] = 'chat.completion'
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class DeltaToolCallFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal['function'] | None = None
    function: DeltaToolCallFunction


class Delta(BaseModel):
    role: Literal['assistant'] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal['stop', 'length', 'tool_calls'] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal['chat.completion.chunk'] = 'chat.completion.chunk'
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: per token its text, log-prob, top alternatives and character offset."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal['stop', 'length'] | None


class Completion(BaseModel):
    id: str
    object: Literal['text_completion'] = 'text_completion'
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    """An entry of `/v1/models`. Beyond OpenAI's fields: `root` / `parent` (the base model, as vLLM names them) and,
    for a checkpoint, `alias` (the short name ``<base>:<checkpoint name>``)."""

    id: str
    object: Literal['model'] = 'model'
    created: int
    owned_by: str
    root: str
    parent: str | None = None
    alias: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal['list'] = 'list'
    data: list[ModelCard]
