"""Alpaca rows ``{instruction, input?, output, system?}`` -> a Trajectory."""

from __future__ import annotations

from typing import Any

from twinkle_core.preprocessor.base import Preprocessor, require_fields
from twinkle_core.preprocessor.messages_util import message, with_system


class AlpacaProcessor(Preprocessor):
    """User turn = `instruction`, followed by a blank line and `input` when `input` is non-empty;
    assistant turn = `output`. A row's own `system` field wins over the `system` given here."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        require_fields(row, ('instruction', 'output'), type(self).__name__)
        query = str(row['instruction'])
        extra = row.get('input')
        if extra:
            query = f'{query}\n\n{extra}'
        system = row.get('system') or self.system
        return {'messages': with_system(system, [message('user', query), message('assistant', str(row['output']))])}
