"""The helpers the Twinkle documents' scripts import from the package root (``from twinkle_core import
get_logger, get_device_placement, DingNotifier``), served lazily by `twinkle_core.__getattr__`."""

from __future__ import annotations

import logging
import os

from twinkle_core.hooks.notifier import WebhookNotifier
from twinkle_core.runtime.context import current_runtime, device_groups, global_device_mesh

FORMAT = '%(asctime)s %(levelname)s %(name)s: %(message)s'


def get_logger(name: str = 'twinkle', level: int = logging.INFO) -> logging.Logger:
    """The twinkle logger a script logs with (the documents' ``logger = get_logger()``): a logger under
    ``twinkle``; the first call gives ``twinkle`` a console handler at `level` unless the application configured
    logging already (the root logger has handlers)."""
    root = logging.getLogger('twinkle')
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    return logging.getLogger(name if name == 'twinkle' or name.startswith('twinkle.') else f'twinkle.{name}')


def get_device_placement() -> str:
    """Where this script's components run, as text (the documents log it): the runtime, this process's rank
    (under torchrun), the global device mesh and the device groups."""
    runtime = current_runtime()
    lines = [f'runtime: {runtime.name if runtime is not None else "none (call twinkle_core.initialize)"}']
    if 'RANK' in os.environ:
        lines.append(
            f'rank {os.environ["RANK"]} of {os.environ.get("WORLD_SIZE", "?")} '
            f'(local rank {os.environ.get("LOCAL_RANK", "?")})'
        )
    mesh = global_device_mesh()
    if mesh is not None:
        lines.append(f'global mesh: {mesh!r}')
    for group in device_groups():
        lines.append(f'group {group.name!r}: ranks {group.ranks} on {group.device_type}')
    return '\n'.join(lines)


class DingNotifier(WebhookNotifier):
    """`WebhookNotifier` in the DingTalk custom-robot format (the documents' name):
    ``initialize(..., notifier=DingNotifier(ROBOT_URL, secret=SEC))``."""

    def __init__(
        self, url: str, *, secret: str | None = None, title: str = 'twinkle job failed', timeout_s: float = 5.0
    ) -> None:
        super().__init__(url, format='dingtalk', secret=secret, title=title, timeout_s=timeout_s)
