"""Lifecycle hooks (pluggy): events that are not "a thing with a name". See `specs` for the hook contracts.

Implementations are discovered through the entry-point group ``twinkle.hooks`` the first time a hook fires;
register one in a script with `register_hooks(obj)`. Fire hooks with `emit_metrics`, `emit_failure` and
`notify_model_loaded`. The shipped metrics loggers live in `twinkle_core.hooks.loggers`.
"""

from twinkle_core.hooks.emit import emit_failure, emit_metrics, notify_model_loaded
from twinkle_core.hooks.manager import (
    call_each,
    failed_hook_plugins,
    get_plugin_manager,
    hook,
    register_hooks,
    reset_plugin_manager,
    unregister_hooks,
)

__all__ = [
    'call_each',
    'emit_failure',
    'emit_metrics',
    'failed_hook_plugins',
    'get_plugin_manager',
    'hook',
    'notify_model_loaded',
    'register_hooks',
    'reset_plugin_manager',
    'unregister_hooks',
]
