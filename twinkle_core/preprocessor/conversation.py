"""Chat rows: ``messages`` (role/content, OpenAI style), ShareGPT ``conversations`` (from/value) or ms-swift style
``query`` / ``response`` (with optional ``history`` pairs and ``system``)."""

from __future__ import annotations

from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.preprocessor.base import Preprocessor, row_excerpt
from twinkle_core.preprocessor.messages_util import message

# ShareGPT speaker names -> standard roles.
SHAREGPT_ROLES: dict[str, str] = {
    'system': 'system',
    'human': 'user',
    'user': 'user',
    'gpt': 'assistant',
    'assistant': 'assistant',
    'bing': 'assistant',
    'chatgpt': 'assistant',
    'bard': 'assistant',
    'function_call': 'assistant',
    'tool': 'tool',
    'observation': 'tool',
    'function': 'tool',
}
ROLES = ('system', 'user', 'assistant', 'tool')
#: The columns by which a row is a chat in one of the layouts `MessagesProcessor` reads.
CHAT_COLUMNS = (('messages',), ('conversations',), ('query', 'response'))


def chat_layout(columns: list[str]) -> tuple[str, ...] | None:
    """The `CHAT_COLUMNS` entry `columns` hold, or None."""
    return next((layout for layout in CHAT_COLUMNS if set(layout) <= set(columns)), None)


class MessagesProcessor(Preprocessor):
    """Normalises chat rows to ``{'messages': [{role, content}, ...], ...}``.

    Accepts `messages` (``role``/``content``), ShareGPT `conversations` (``from``/``value``, speakers mapped by
    `SHAREGPT_ROLES`) or `query` / `response` (ms-swift style; earlier turns as `history` ``[[query, response],
    ...]``). An optional row-level `system` string becomes the first message. Per-message ``loss`` (bool) is kept.
    Other row fields are dropped unless listed in `keep_fields`.
    """

    def __init__(self, system: str | None = None, keep_fields: list[str] | tuple[str, ...] = ()) -> None:
        self.system, self.keep_fields = system, tuple(keep_fields)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        who = type(self).__name__
        if row.get('messages') is not None:
            raw, role_key, content_key, roles = row['messages'], 'role', 'content', None
        elif row.get('conversations') is not None:
            raw, role_key, content_key, roles = row['conversations'], 'from', 'value', SHAREGPT_ROLES
        elif row.get('query') is not None and row.get('response') is not None:
            raw, role_key, content_key, roles = query_response_turns(row), 'role', 'content', None
        else:
            raise InvalidInputError(
                f"{who}: row is missing field 'messages' (or ShareGPT 'conversations', or "
                f"'query' and 'response'); it has {sorted(row)}. Row: {row_excerpt(row)}"
            )
        if not isinstance(raw, list) or not raw:
            raise InvalidInputError(f'{who}: the conversation must be a non-empty list. Row: {row_excerpt(row)}')
        messages = []
        for turn, item in enumerate(raw):
            messages.append(self._convert(item, turn, role_key, content_key, roles, row))
        system = row.get('system') or self.system
        if system and messages[0]['role'] != 'system':
            messages.insert(0, message('system', str(system)))
        out: dict[str, Any] = {'messages': messages}
        for name in self.keep_fields:
            if name in row:
                out[name] = row[name]
        return out

    def _convert(
        self, item: Any, turn: int, role_key: str, content_key: str, roles: dict[str, str] | None, row: dict[str, Any]
    ) -> dict[str, Any]:
        who = type(self).__name__
        if not isinstance(item, dict) or item.get(role_key) is None or item.get(content_key) is None:
            raise InvalidInputError(
                f'{who}: turn {turn} needs fields {role_key!r} and {content_key!r}, got '
                f'{item!r}. Row: {row_excerpt(row)}'
            )
        speaker = str(item[role_key])
        role = roles.get(speaker.lower()) if roles is not None else speaker
        if role not in ROLES:
            known = sorted(roles) if roles is not None else list(ROLES)
            raise InvalidInputError(
                f'{who}: turn {turn} has unknown {role_key} {speaker!r}; expected one of '
                f'{known}. Row: {row_excerpt(row)}'
            )
        out = message(role, str(item[content_key]))
        if item.get('loss') is not None:
            out['loss'] = bool(item['loss'])
        return out


class ShareGPTProcessor(MessagesProcessor):
    """`MessagesProcessor` under the name users of ShareGPT data look for (same behaviour)."""


def query_response_turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    """An ms-swift style row's turns: each `history` pair, then `query` and `response`."""
    history = row.get('history') or []
    if not isinstance(history, list) or any(not isinstance(p, (list, tuple)) or len(p) != 2 for p in history):
        raise InvalidInputError(
            f'MessagesProcessor: history must be a list of [query, response] pairs. Row: {row_excerpt(row)}'
        )
    turns = [*history, (row['query'], row['response'])]
    return [message(role, str(text)) for pair in turns for role, text in zip(('user', 'assistant'), pair)]
