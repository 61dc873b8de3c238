"""The Tool interface: a named function with a JSON-schema signature that a policy calls by emitting a tool call.

A tool is described to the model by `schema()` (the OpenAI / chat-template ``tools`` entry) and run with the
arguments the model produced: ``tool(**arguments) -> str``, the text the model sees as the tool's answer. Tools are
registered under kind ``tool`` (entry point group ``twinkle.tool``) and resolved by name; `twinkle_agentic` runs
them in a sandboxed worker process with a timeout and resource limits unless ``sandboxed`` is False; a tool
declares the network, host paths and environment variables it needs there (`Tool`; `twinkle_core.tool.access`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from twinkle_core.errors import TwinkleError
from twinkle_core.tool.access import PathDeclaration, declared_access


class ToolError(TwinkleError):
    """A tool refused its arguments or failed; the message is shown to the model, the rollout goes on."""


class Tool(ABC):
    """A callable tool. Subclasses set `name`, `description`, `parameters` (a JSON schema of ``type: object``) and
    implement `__call__`. `timeout_s`: wall-clock limit of one call; `sandboxed`: run in a worker process (the
    default; False only for tools that must touch this process's state, e.g. an environment's).

    What a sandboxed call may reach beyond its sandbox (no network, no host file but the Python runtime, an empty
    environment) is what the tool declares, and only that:

    - `network`: True shares the host's network (and the /etc files name resolution and TLS read); default False,
      a network namespace with a loopback of its own.
    - `paths`: host paths bound at the same place in the sandbox, each ``'/data'`` or ``('/data', 'ro')``
      read-only, or ``('/out', 'rw')`` read-write; absolute, and existing when the tool is added to a manager.
    - `env`: names of this process's environment variables copied into the call (those that are set).

    Declare them as class attributes or per instance (``@tool(network=True, paths=[...], env=[...])`` for a
    function). A malformed declaration raises `InvalidInputError` naming the tool -- at class definition, at
    ``@tool``, or when the tool is added to a `ToolManager` (`twinkle_core.tool.access.check_access`). Only
    sandboxed calls honour them: a tool with ``sandboxed = False``, or any tool run unsandboxed (a manager's
    ``allow_unsandboxed=True`` where bubblewrap is missing), has all of this process's access whatever it declares.
    The names `network`, `paths` and `env` are reserved for this on every tool.
    """

    name: ClassVar[str] = ''
    description: ClassVar[str] = ''
    parameters: ClassVar[dict[str, Any]] = {'type': 'object', 'properties': {}}
    timeout_s: float = 10.0
    sandboxed: bool = True
    network: bool = False
    paths: tuple[PathDeclaration, ...] = ()
    env: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if any(field in vars(cls) for field in ('network', 'paths', 'env')):
            declared_access(cls, cls.__name__)  # a malformed class-level declaration fails where it is written

    @abstractmethod
    def __call__(self, **arguments: Any) -> str:
        """Run the tool; return the text the model sees. Raise `ToolError` for bad arguments."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool description (what chat templates render under ``tools``)."""
        return {
            'type': 'function',
            'function': {'name': self.name, 'description': self.description, 'parameters': self.parameters},
        }
