"""`ToolManager`: the tools of a rollout, described to the model (`schemas`) and called by name (`call`,
`call_many`, ``manager(tool_call)``), sandboxed tools in a bubblewrap sandbox per call
(`twinkle_agentic.tools.sandbox`), the others in a thread of this process. No call raises: every failure is a
`ToolResult` whose `output` is an error message the model can read ("Error: unknown tool 'foo'; available:
calculator, python")."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from twinkle_agentic.tools.grant import grant_of
from twinkle_agentic.tools.sandbox import Sandbox, SandboxLimits, ToolResult, failure, truncate
from twinkle_core.errors import TwinkleError
from twinkle_core.registry import resolve
from twinkle_core.tool.base import Tool, ToolError
from twinkle_core.tool.decorator import validate_arguments

ToolSpec = str | Tool | Callable[..., Any]


class ToolManager:
    """The tools a policy may call. `tools`: registry names (kind ``tool``, with no arguments), `Tool` instances or
    typed functions (made tools as by ``@tool``). `timeout_s`: every call's limit (default: each tool's own);
    `max_output_chars`: answers are cut there, with a marker; `memory_mb` / `max_processes`: the limits of a
    sandboxed call (`memory_mb` for all its processes together where cgroups allow, else per process: see
    `twinkle_agentic.tools.sandbox`); `max_workers`: how many calls run at once (`call_many`, and concurrent `call`s
    of sandboxed tools). A sandboxed tool reaches the network, host paths and environment variables only as it
    declares (`twinkle_agentic.tools.grant`). Where bubblewrap is unusable, adding a sandboxed tool raises
    `TwinkleError` naming the package to install, unless `allow_unsandboxed` (trusted tools only: they then run as
    plain processes that can read this host's files, network and processes). Unsandboxed tools (``sandboxed =
    False``) run in a thread here; one that outlives its timeout is reported and left to finish in the background (a
    thread cannot be killed). Use as a context manager, or `close`."""

    def __init__(
        self,
        tools: Sequence[ToolSpec] = (),
        *,
        timeout_s: float | None = None,
        max_output_chars: int = 4096,
        memory_mb: int | None = 1024,
        max_workers: int = 4,
        max_processes: int = 16,
        allow_unsandboxed: bool = False,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        limits = SandboxLimits(memory_mb=memory_mb, max_processes=max_processes, max_output_chars=max_output_chars)
        self._sandbox = Sandbox(limits, allow_unsandboxed=allow_unsandboxed)
        self._tools: dict[str, Tool] = {}
        for spec in tools:
            self.add(spec)
        self._slots = threading.BoundedSemaphore(max_workers)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix='twinkle-tool')
        self._closed = False

    def add(self, spec: ToolSpec) -> Tool:
        """Add one tool (a name, a `Tool` or a typed function). `TwinkleError`: a name already taken, a malformed
        grant (`grant_of`), or a sandboxed tool where calls cannot be sandboxed (without `allow_unsandboxed`)."""
        obj = resolve('tool', spec)
        if not isinstance(obj, Tool):
            raise TwinkleError(f'{spec!r} resolved to {obj!r}, which is not a twinkle_core.tool.Tool')
        if not obj.name:
            raise TwinkleError(f'tool {obj!r} has no name')
        if obj.name in self._tools:
            raise TwinkleError(f'two tools are named {obj.name!r}')
        if obj.sandboxed:
            grant_of(obj)
            why = self._sandbox.unavailable()
            if why is not None and not self._sandbox.allow_unsandboxed:
                raise TwinkleError(f'tool {obj.name!r}: {why}')
        self._tools[obj.name] = obj
        return obj

    def names(self) -> list[str]:
        """The tools' names, in the order given."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI function-tool descriptions (a chat template's ``tools``)."""
        return [t.schema() for t in self._tools.values()]

    def get(self, name: str) -> Tool:
        """The tool named `name` (KeyError naming the available ones)."""
        if name not in self._tools:
            raise KeyError(f'unknown tool {name!r}; available: {", ".join(self._tools) or "none"}')
        return self._tools[name]

    def call(self, name: str, arguments: dict[str, Any] | str | None = None) -> ToolResult:
        """Run one call. `arguments`: a dict or its JSON text ('' and None mean no arguments)."""
        try:
            return self._call(name, arguments)
        except Exception as exc:  # noqa: BLE001 - a manager bug must not end the rollout
            return failure(str(name), 'exception', f'calling tool {name!r} failed: {type(exc).__name__}: {exc}')

    def call_many(self, calls: Sequence[tuple[str, dict[str, Any] | str | None]]) -> list[ToolResult]:
        """Run `calls` concurrently (up to `max_workers` at once); results in the order of `calls`."""
        if self._closed:
            return [self.call(name, arguments) for name, arguments in calls]
        return list(self._pool.map(lambda c: self.call(*c), calls))

    def __call__(self, tool_call: dict[str, Any]) -> str:
        """The answer text of one tool call given as ``{'name', 'arguments'}`` or OpenAI's ``{'function': {...}}``;
        an error message instead of raising."""
        try:
            call = tool_call.get('function') or tool_call
            name = call.get('name')
            if not isinstance(name, str) or not name:
                return f'Error: a tool call needs a tool name; available: {", ".join(self._tools) or "none"}'
            return self.call(name, call.get('arguments')).output
        except Exception as exc:  # noqa: BLE001 - shown to the model
            return f'Error: malformed tool call {tool_call!r:.200}: {type(exc).__name__}: {exc}'

    def close(self) -> None:
        """Kill calls in flight in worker processes and stop; later calls report ``killed``. Idempotent."""
        self._closed = True
        self._sandbox.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ToolManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, arguments: dict[str, Any] | str | None) -> ToolResult:
        if name not in self._tools:
            return failure(name, 'unknown_tool', f'unknown tool {name!r}; available: {", ".join(self._tools)}')
        tool = self._tools[name]
        if self._closed:
            return failure(name, 'killed', f'tool {name!r} was not run: the tool manager is closed')
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = {}
        elif isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                return failure(name, 'bad_arguments', f'bad arguments for tool {name!r}: not valid JSON ({exc})')
        try:
            checked = validate_arguments(tool.parameters, arguments, name)
        except ToolError as exc:
            return failure(name, 'bad_arguments', str(exc))
        timeout_s = float(self.timeout_s if self.timeout_s is not None else tool.timeout_s)
        if not tool.sandboxed:
            return self._run_here(tool, checked, timeout_s)
        with self._slots:
            return self._sandbox.run(tool, checked, timeout_s, name)

    def _run_here(self, tool: Tool, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome['output'] = tool(**arguments)
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome['error'] = exc

        start = time.monotonic()
        worker = threading.Thread(target=target, name=f'twinkle-tool-{tool.name}', daemon=True)
        worker.start()
        worker.join(timeout_s)
        elapsed, name = time.monotonic() - start, tool.name
        if worker.is_alive():
            return failure(name, 'timeout', f'tool {name!r} timed out after {timeout_s:.1f} s', elapsed)
        exc = outcome.get('error')
        if exc is None:
            text = outcome['output']
            return ToolResult(name, truncate(text if isinstance(text, str) else str(text), self.max_output_chars),
                              elapsed_s=elapsed)  # fmt: skip
        if isinstance(exc, ToolError):
            return failure(name, 'bad_arguments', truncate(str(exc), self.max_output_chars), elapsed)
        if isinstance(exc, MemoryError):
            return failure(name, 'memory', f'tool {name!r} ran out of memory', elapsed)
        detail = truncate(f'{type(exc).__name__}: {exc}', self.max_output_chars)
        return failure(name, 'exception', f'tool {name!r} failed: {detail}', elapsed)
