"""Server-sent events for ``stream: true``: `data: {chunk}` lines, then `data: [DONE]`.

The samplers here return whole sequences, so a stream starts once its sequences are sampled (an error before that
is an ordinary HTTP error) and then sends them token by token: per choice a first chunk with the role, one chunk
per token that adds text (with that token's log-probs when asked), then a chunk with the finish reason; a chat choice
that made tool calls sends its content (if any) and its calls in one chunk each. With
``stream_options.include_usage`` every chunk carries ``usage: null`` and a last chunk without choices the usage.
The pieces of a choice's chunks concatenate to exactly the text the same request gives without streaming.
"""

from __future__ import annotations

import json
from typing import Iterator

from pydantic import BaseModel

from twinkle_server.api.openai.chat import RenderedChat
from twinkle_server.api.openai.responses import chat_answer, chat_logprobs, completion_logprobs
from twinkle_server.api.openai.schemas import (
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Delta,
    DeltaToolCall,
    DeltaToolCallFunction,
    Usage,
)
from twinkle_server.api.openai.text import DecodedSequence, Detokenizer

DONE = b'data: [DONE]\n\n'
HEADERS = {'cache-control': 'no-cache', 'x-accel-buffering': 'no'}


def event(obj: BaseModel) -> bytes:
    return b'data: ' + json.dumps(obj.model_dump(mode='json'), ensure_ascii=False).encode() + b'\n\n'


def _with_usage(chunk: BaseModel, include_usage: bool) -> bytes:
    data = chunk.model_dump(mode='json')
    if not include_usage:
        data.pop('usage', None)
    return b'data: ' + json.dumps(data, ensure_ascii=False).encode() + b'\n\n'


def chat_events(
    ident: str,
    created: int,
    model: str,
    det: Detokenizer,
    sequences: list[DecodedSequence],
    rendered: RenderedChat,
    logprobs: int | None,
    usage: Usage | None,
) -> Iterator[bytes]:
    """The chunks of a chat completion (`usage`: given when ``stream_options.include_usage``)."""

    def chunk(choice: ChunkChoice) -> bytes:
        return _with_usage(ChatCompletionChunk(id=ident, created=created, model=model, choices=[choice]), bool(usage))

    for index, seq in enumerate(sequences):
        yield chunk(ChunkChoice(index=index, delta=Delta(role='assistant', content='')))
        answer = chat_answer(seq, rendered)
        if answer.tool_calls:
            lps = chat_logprobs(det, seq, logprobs) if logprobs is not None else None
            if answer.content:
                yield chunk(ChunkChoice(index=index, delta=Delta(content=answer.content)))
            calls = [
                DeltaToolCall(
                    index=k,
                    id=c.id,
                    type='function',
                    function=DeltaToolCallFunction(name=c.function.name, arguments=c.function.arguments),
                )
                for k, c in enumerate(answer.tool_calls)
            ]
            yield chunk(ChunkChoice(index=index, delta=Delta(tool_calls=calls), logprobs=lps))
        else:
            for k, piece in enumerate(seq.pieces):
                lps = chat_logprobs(det, seq, logprobs, k, k + 1) if logprobs is not None else None
                if piece or lps is not None:
                    yield chunk(ChunkChoice(index=index, delta=Delta(content=piece), logprobs=lps))
        yield chunk(ChunkChoice(index=index, delta=Delta(), finish_reason=answer.finish_reason))  # type: ignore[arg-type]
    if usage is not None:
        yield event(ChatCompletionChunk(id=ident, created=created, model=model, choices=[], usage=usage))
    yield DONE


def completion_events(
    ident: str,
    created: int,
    model: str,
    det: Detokenizer,
    sequences: list[DecodedSequence],
    logprobs: int | None,
    usage: Usage | None,
) -> Iterator[bytes]:
    """The chunks of a (legacy) completion: one per token that adds text, then one with the finish reason."""

    def chunk(choice: CompletionChoice) -> bytes:
        return _with_usage(
            Completion(id=ident, created=created, model=model, choices=[choice], usage=None), bool(usage)
        )

    for index, seq in enumerate(sequences):
        offset = 0
        for k, piece in enumerate(seq.pieces):
            lps = completion_logprobs(det, seq, logprobs, k, k + 1, offset) if logprobs is not None else None
            offset += len(piece)
            if piece or lps is not None:
                yield chunk(CompletionChoice(index=index, text=piece, logprobs=lps, finish_reason=None))
        yield chunk(CompletionChoice(index=index, text='', logprobs=None, finish_reason=seq.finish_reason))  # type: ignore[arg-type]
    if usage is not None:
        yield event(Completion(id=ident, created=created, model=model, choices=[], usage=usage))
    yield DONE
