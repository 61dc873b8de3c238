"""Self-cognition rows ``{query, response}`` with ``{{NAME}}`` / ``{{AUTHOR}}`` placeholders -> a Trajectory."""

from __future__ import annotations

from typing import Any

from twinkle_core.preprocessor.base import Preprocessor, require_fields
from twinkle_core.preprocessor.messages_util import message, with_system


class SelfCognitionProcessor(Preprocessor):
    """Teach a model its name: fills ``{{NAME}}``/``{{AUTHOR}}`` in `query` and `response`.

    Output: ``{'messages': [system?, user(query), assistant(response)]}``.
    """

    def __init__(self, model_name: str, model_author: str, system: str | None = None) -> None:
        if not model_name or not model_author:
            raise ValueError('SelfCognitionProcessor needs a non-empty model_name and model_author.')
        self.model_name, self.model_author, self.system = model_name, model_author, system

    def _fill(self, text: str) -> str:
        return text.replace('{{NAME}}', self.model_name).replace('{{AUTHOR}}', self.model_author)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        require_fields(row, ('query', 'response'), type(self).__name__)
        return {
            'messages': with_system(
                self.system,
                [
                    message('user', self._fill(str(row['query']))),
                    message('assistant', self._fill(str(row['response']))),
                ],
            )
        }
