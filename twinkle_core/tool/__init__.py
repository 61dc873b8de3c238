"""Kind `tool`: functions a policy calls during a multi-turn rollout (`twinkle_agentic` runs them sandboxed).
`Tool` is the interface; `twinkle_core.tool.decorator.tool` makes one from a typed function."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.tool.base import Tool, ToolError

__all__ = ['Tool', 'ToolError']
__getattr__ = kind_getattr('tool', __name__)
