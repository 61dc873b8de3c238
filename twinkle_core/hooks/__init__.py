"""Lifecycle hooks (pluggy): events that are not "a thing with a name". See `specs` for the hook contracts.

Implementations are discovered through the entry-point group ``twinkle.hooks`` the first time a hook fires.
"""
from twinkle_core.hooks.manager import get_plugin_manager, hook, register_hooks

__all__ = ['get_plugin_manager', 'hook', 'register_hooks']
