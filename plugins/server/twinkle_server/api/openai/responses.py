"""Decoded sequences -> OpenAI's choice objects (chat and legacy completions), their log-probs and tool calls."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from twinkle_server.api.openai.chat import RenderedChat
from twinkle_server.api.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    ResponseFunction,
    ResponseToolCall,
    TokenLogprob,
    TopLogprob,
)
from twinkle_server.api.openai.text import DecodedSequence, Detokenizer


def new_id(prefix: str) -> str:
    return f'{prefix}-{uuid.uuid4().hex}'


@dataclass(frozen=True)
class ChatAnswer:
    """A chat choice's content and tool calls, and its finish reason (``tool_calls`` when it made calls)."""

    content: str | None
    tool_calls: list[ResponseToolCall]
    finish_reason: str


def chat_answer(seq: DecodedSequence, rendered: RenderedChat) -> ChatAnswer:
    """Split a sequence's text into content and tool calls (when the request offered tools and the text holds
    well-formed calls in the model's format; otherwise everything is content)."""
    parsed = rendered.tool_format.parse(seq.text) if rendered.tool_format is not None else None
    if parsed is None or not parsed.calls:
        return ChatAnswer(seq.text, [], seq.finish_reason)
    calls = parsed.calls if rendered.parallel_tool_calls else parsed.calls[:1]
    return ChatAnswer(
        parsed.content,
        [
            ResponseToolCall(
                id=f'call_{uuid.uuid4().hex[:24]}', function=ResponseFunction(name=c.name, arguments=c.arguments)
            )
            for c in calls
        ],
        'tool_calls',
    )


def chat_logprobs(
    det: Detokenizer, seq: DecodedSequence, top: int, start: int = 0, stop: int | None = None
) -> ChoiceLogprobs:
    """The `logprobs` of a chat choice for tokens [start, stop) of `seq` (`top`: alternatives per token)."""
    ids = seq.tokens[start:stop]
    texts = det.token_texts(ids)
    entries = []
    for i, (text, lp) in enumerate(zip(texts, seq.logprobs[start:stop])):
        alternatives = seq.top[start + i][:top] if top else []
        alt_texts = det.token_texts([t for t, _ in alternatives])
        entries.append(
            TokenLogprob(
                token=text,
                logprob=lp,
                bytes=list(text.encode()),
                top_logprobs=[
                    TopLogprob(token=t, logprob=p, bytes=list(t.encode())) for t, (_, p) in zip(alt_texts, alternatives)
                ],
            )
        )
    return ChoiceLogprobs(content=entries)


def chat_choice(
    index: int, det: Detokenizer, seq: DecodedSequence, rendered: RenderedChat, logprobs: int | None
) -> ChatChoice:
    """`logprobs`: None for none, else the number of top alternatives per token."""
    answer = chat_answer(seq, rendered)
    return ChatChoice(
        index=index,
        message=AssistantMessage(content=answer.content, tool_calls=answer.tool_calls or None),
        logprobs=chat_logprobs(det, seq, logprobs) if logprobs is not None else None,
        finish_reason=answer.finish_reason,  # type: ignore[arg-type]
    )


def completion_logprobs(
    det: Detokenizer, seq: DecodedSequence, top: int, start: int = 0, stop: int | None = None, offset: int = 0
) -> CompletionLogprobs:
    """The legacy `logprobs` for tokens [start, stop) of `seq`; `offset`: the text position of token `start`."""
    ids = seq.tokens[start:stop]
    texts = det.token_texts(ids)
    offsets = []
    for piece in seq.pieces[start:stop]:
        offsets.append(offset)
        offset += len(piece)
    tops = None
    if top:
        tops = []
        for step in seq.top[start:stop]:
            alternatives = step[:top]
            tops.append(dict(zip(det.token_texts([t for t, _ in alternatives]), (p for _, p in alternatives))))
    return CompletionLogprobs(
        tokens=texts, token_logprobs=list(seq.logprobs[start:stop]), top_logprobs=tops, text_offset=offsets
    )


def completion_choice(index: int, det: Detokenizer, seq: DecodedSequence, logprobs: int | None) -> CompletionChoice:
    return CompletionChoice(
        index=index,
        text=seq.text,
        logprobs=completion_logprobs(det, seq, logprobs) if logprobs is not None else None,
        finish_reason=seq.finish_reason,  # type: ignore[arg-type]
    )
