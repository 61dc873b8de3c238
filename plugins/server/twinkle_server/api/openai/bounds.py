"""Bounds on a `/v1` request, checked before any rendering or tokenisation, so a request that cannot fit the
model's context is refused in milliseconds and costs no more memory than its (bounded) body.

- **Body.** Read with a cap of `body_limit` bytes: `BODY_BYTES_PER_CONTEXT_TOKEN` per token of the longest context
  served plus `BODY_BASE_BYTES` (within the server's `max_body_bytes`). A declared or streamed body past it is read
  and discarded (never parsed, never held) and answered 400 ``request_too_large``. This cap is a policy, set well
  above what a prompt that fits takes with ordinary text (a few characters per token at 1-6 JSON bytes each, plus
  a message's envelope ``{"role":"user","content":""}`` per message); the base is for tool schemas and settings.
- **Messages.** Every chat template renders at least one token per message (its role marker), so more messages
  than the context length cannot fit: 400 naming the count and the cap.
- **Characters.** No token covers more characters than the tokenizer's longest vocabulary entry (`chars_per_token`:
  for byte-level BPE an entry has one character per byte, for SentencePiece one per character, so it bounds the
  text a token decodes to), so text longer than context length x `chars_per_token` characters cannot fit: message
  contents, names, tool-call names and arguments and the tool schemas' JSON are counted together (400 naming the
  total and the cap). A legacy completion's text prompt is bounded the same way, a token-id prompt by the context
  length itself. (A tokenizer whose normalizer deletes or merges characters could fit more; such a request is
  refused.)
- **Tools.** At most `MAX_TOOLS` tool schemas (OpenAI's own limit); their serialized size counts in the characters.

Counting walks the parsed request once, keeping only a running total (O(1) extra memory), and stops at the cap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from twinkle_server.api.openai.errors import invalid
from twinkle_server.api.openai.schemas import ChatCompletionRequest

#: body bytes allowed per token of the longest served context (see the module docstring)
BODY_BYTES_PER_CONTEXT_TOKEN = 256
#: body bytes allowed on top of that: tool schemas and the request's settings
BODY_BASE_BYTES = 256 * 1024
#: tool schemas one chat request may give (OpenAI's limit)
MAX_TOOLS = 128


def body_limit(contexts: Iterable[int], max_body_bytes: int) -> int:
    """The byte cap of a `/v1` body: what the longest of the served `contexts` allows, within `max_body_bytes`."""
    longest = max(contexts, default=0)
    return min(max_body_bytes, longest * BODY_BYTES_PER_CONTEXT_TOKEN + BODY_BASE_BYTES)


def too_large(size: int, limit: int, context: int) -> Exception:
    """The 400 for a body of `size` bytes (at least) over `limit`."""
    return invalid(
        f'the request body has {size} bytes (or more); /v1 requests to this server may have at most {limit} bytes '
        f'({BODY_BYTES_PER_CONTEXT_TOKEN} per token of the longest context served, {context} tokens, plus '
        f'{BODY_BASE_BYTES}); a request that large cannot fit the context',
        code='request_too_large',
    )


def chars_per_token(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` can decode to: its longest vocabulary entry (added tokens
    included). Computed once per served model (a pass over the vocabulary)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1)


def check_chat(req: ChatCompletionRequest, context: int, per_token: int) -> None:
    """400 for a chat request that cannot fit `context` tokens of at most `per_token` characters each: too many
    messages, tools or characters."""
    if len(req.messages) > context:
        raise invalid(
            f"messages has {len(req.messages)} entries; this model's context length is {context} tokens and each "
            f'message takes at least one, so at most {context} messages are accepted',
            param='messages',
            code='context_length_exceeded',
        )
    tools = req.tools or []
    if len(tools) > MAX_TOOLS:
        raise invalid(f'tools has {len(tools)} entries; at most {MAX_TOOLS} are accepted', param='tools')
    cap = context * per_token
    total = 0
    for size in _chat_sizes(req):
        total += size
        if total > cap:
            raise invalid(
                f"the messages and tools hold more than {cap} characters of text; this model's context length is "
                f'{context} tokens and its tokens cover at most {per_token} characters each, so more cannot fit',
                param='messages',
                code='context_length_exceeded',
            )


def check_prompt_items(items: list[Any], context: int, per_token: int) -> None:
    """400 for a legacy completion prompt that cannot fit: a text over `context` x `per_token` characters, token ids
    >= `context`."""
    cap = context * per_token
    for i, item in enumerate(items):
        size = len(item) if isinstance(item, (str, list)) else 0
        if isinstance(item, str) and size > cap:
            raise invalid(
                f"prompt {i} has {size} characters; this model's context length is {context} tokens and its tokens "
                f'cover at most {per_token} characters each, so at most {cap} can fit',
                param='prompt',
                code='context_length_exceeded',
            )
        if isinstance(item, list) and size >= context:
            raise invalid(
                f"the prompt has {size} tokens; this model's context length is {context}",
                param='prompt',
                code='context_length_exceeded',
            )


def _chat_sizes(req: ChatCompletionRequest) -> Iterable[int]:
    """The character counts of every text the request renders, one at a time."""
    for m in req.messages:
        content = m.content
        if isinstance(content, str):
            yield len(content)
        elif content is not None:
            for part in content:
                text = part.get('text')
                yield len(text) if isinstance(text, str) else 0
        yield len(m.name or '') + len(m.tool_call_id or '')
        for call in m.tool_calls or ():
            yield len(call.function.name) + len(call.function.arguments)
    for tool in req.tools or ():
        yield len(json.dumps(tool.model_dump(exclude_none=True), ensure_ascii=False))
