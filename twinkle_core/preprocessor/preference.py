"""`ChosenRejectedProcessor`: preference rows in the usual layouts -> one normalised (prompt, chosen, rejected) row.

Accepted layouts (the first that matches a row):

- **explicit prompt** (TRL's standard and conversational formats, UltraFeedback-binarized): ``prompt`` (text or
  messages) + ``chosen`` + ``rejected`` (text, or messages -- with or without the prompt's turns in front);
- **implicit prompt**: ``chosen`` + ``rejected`` only, two whole conversations that share their prompt: messages,
  or Anthropic-HH text (``"\\n\\nHuman: ... \\n\\nAssistant: ..."``);
- **ms-swift / Twinkle**: ``messages`` ending with the chosen assistant turn + ``rejected_response`` (text).

Output: ``{'messages': the prompt turns (ending before the answer), 'chosen': [assistant turns], 'rejected':
[assistant turns]}`` plus ``margin`` when the row has one (`BradleyTerryLoss` reads it) and any `keep_fields`.
`twinkle_core.eval.preference.encode_pairs` turns such rows into the (chosen, rejected) training rows that
`DPOLoss`, `ORPOLoss`, `CPOLoss` and `BradleyTerryLoss` take.
"""

from __future__ import annotations

import re
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.preprocessor.base import Preprocessor, row_excerpt
from twinkle_core.preprocessor.messages_util import message

_HH_TURN = re.compile(r'\n\n(Human|Assistant):')
_HH_ROLES = {'Human': 'user', 'Assistant': 'assistant'}


def hh_messages(text: str) -> list[dict[str, Any]]:
    """Anthropic-HH text (``"\\n\\nHuman: hi\\n\\nAssistant: hello"``) -> messages."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3:
        raise InvalidInputError(f'not Anthropic-HH text (no "\\n\\nHuman:" / "\\n\\nAssistant:" turns): {text[:80]!r}')
    return [message(_HH_ROLES[role], content.strip()) for role, content in zip(parts[1::2], parts[2::2])]


class ChosenRejectedProcessor(Preprocessor):
    """Normalise preference rows (kind ``preprocessor``, name ``ChosenRejectedProcessor``; layouts above).

    Args:
        system: a system message put first when the prompt has none.
        keep_fields: other row fields copied to the output (``margin`` always is).
    """

    def __init__(self, system: str | None = None, keep_fields: list[str] | tuple[str, ...] = ()) -> None:
        self.system, self.keep_fields = system, tuple(keep_fields)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get('rejected_response') is not None and row.get('messages') is not None:
            prompt, chosen = self._split_last_answer(self._messages(row['messages'], row, 'messages'), row)
            rejected = [message('assistant', str(row['rejected_response']))]
        elif row.get('chosen') is not None and row.get('rejected') is not None:
            prompt, chosen, rejected = self._pair(row)
        else:
            raise InvalidInputError(
                f"ChosenRejectedProcessor: the row needs 'chosen' and 'rejected' (with or without 'prompt'), or "
                f"'messages' and 'rejected_response'; it has {sorted(row)}. Row: {row_excerpt(row)}"
            )
        if self.system and (not prompt or prompt[0]['role'] != 'system'):
            prompt = [message('system', self.system), *prompt]
        out: dict[str, Any] = {'messages': prompt, 'chosen': chosen, 'rejected': rejected}
        for name in ('margin', *self.keep_fields):
            if name in row:
                out[name] = row[name]
        return out

    def _pair(self, row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        chosen, rejected = (self._messages(row[k], row, k) for k in ('chosen', 'rejected'))
        if row.get('prompt') is not None:
            prompt = self._messages(row['prompt'], row, 'prompt', role='user')
            return prompt, _without_prefix(chosen, prompt), _without_prefix(rejected, prompt)
        shared = 0  # implicit prompt: the turns both conversations start with, up to the last answer
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        while shared and chosen[shared - 1]['role'] == 'assistant':  # the answers start after a non-assistant turn
            shared -= 1
        if not shared:
            raise InvalidInputError(
                f'ChosenRejectedProcessor: chosen and rejected share no prompt turns; give a prompt field. '
                f'Row: {row_excerpt(row)}'
            )
        return chosen[:shared], chosen[shared:], rejected[shared:]

    @staticmethod
    def _messages(value: Any, row: dict[str, Any], field: str, role: str = 'assistant') -> list[dict[str, Any]]:
        """A field's text (a `role` turn, or Anthropic-HH turns) or messages -> messages."""
        if isinstance(value, str):
            return hh_messages(value) if _HH_TURN.search(value) else [message(role, value)]
        if isinstance(value, list) and value and all(isinstance(m, dict) and 'role' in m for m in value):
            return [message(str(m['role']), str(m.get('content') or '')) for m in value]
        raise InvalidInputError(
            f'ChosenRejectedProcessor: {field!r} must be text or a non-empty list of messages (role, content); '
            f'got {type(value).__name__}. Row: {row_excerpt(row)}'
        )

    @staticmethod
    def _split_last_answer(
        messages: list[dict[str, Any]], row: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if len(messages) < 2 or messages[-1]['role'] != 'assistant':
            raise InvalidInputError(
                f"ChosenRejectedProcessor: 'messages' must end with the chosen assistant answer after the prompt. "
                f'Row: {row_excerpt(row)}'
            )
        return messages[:-1], messages[-1:]


def _without_prefix(turns: list[dict[str, Any]], prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`turns` without the `prompt` turns in front (UltraFeedback's answers repeat the prompt)."""
    if len(turns) > len(prompt) and turns[: len(prompt)] == prompt:
        return turns[len(prompt) :]
    if turns and turns[0]['role'] != 'assistant':
        raise InvalidInputError(
            f'ChosenRejectedProcessor: an answer starts with a {turns[0]["role"]!r} turn that is not the '
            "prompt's; answers are assistant turns (optionally after the prompt's turns)."
        )
    return turns
