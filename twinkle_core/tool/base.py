"""The Tool interface: a named function with a JSON-schema signature that a policy calls by emitting a tool call.

A tool is described to the model by `schema()` (the OpenAI / chat-template ``tools`` entry) and run with the
arguments the model produced: ``tool(**arguments) -> str``, the text the model sees as the tool's answer. Tools are
registered under kind ``tool`` (entry point group ``twinkle.tool``) and resolved by name; `twinkle_agentic` runs
them in a sandboxed worker process with a timeout and resource limits unless ``sandboxed`` is False.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from twinkle_core.errors import TwinkleError


class ToolError(TwinkleError):
    """A tool refused its arguments or failed; the message is shown to the model, the rollout goes on."""


class Tool(ABC):
    """A callable tool. Subclasses set `name`, `description`, `parameters` (a JSON schema of ``type: object``) and
    implement `__call__`. `timeout_s`: wall-clock limit of one call; `sandboxed`: run in a worker process (the
    default; False only for tools that must touch this process's state, e.g. an environment's)."""

    name: ClassVar[str] = ''
    description: ClassVar[str] = ''
    parameters: ClassVar[dict[str, Any]] = {'type': 'object', 'properties': {}}
    timeout_s: float = 10.0
    sandboxed: bool = True

    @abstractmethod
    def __call__(self, **arguments: Any) -> str:
        """Run the tool; return the text the model sees. Raise `ToolError` for bad arguments."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool description (what chat templates render under ``tools``)."""
        return {
            'type': 'function',
            'function': {'name': self.name, 'description': self.description, 'parameters': self.parameters},
        }
