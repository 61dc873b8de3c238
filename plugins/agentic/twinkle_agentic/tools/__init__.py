"""Tools for agentic RL: the `Tool` interface and ``@tool`` (from twinkle_core), `ToolManager` (calls tools by
name, sandboxed ones in a bubblewrap sandbox per call with limits: `sandbox`, `bwrap`, `cgroup`; what a tool may
reach beyond it: `grant`), and the built-in `Calculator` and `PythonTool`."""

from twinkle_agentic.tools.builtin import Calculator, PythonTool
from twinkle_agentic.tools.grant import Grant
from twinkle_agentic.tools.manager import ToolManager
from twinkle_agentic.tools.sandbox import SandboxLimits, ToolResult
from twinkle_core.tool.base import Tool, ToolError
from twinkle_core.tool.decorator import FunctionTool, tool

__all__ = [
    'Calculator',
    'FunctionTool',
    'Grant',
    'PythonTool',
    'SandboxLimits',
    'Tool',
    'ToolError',
    'ToolManager',
    'ToolResult',
    'tool',
]
