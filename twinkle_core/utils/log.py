"""`get_logger`: the twinkle logger a script logs with (the Twinkle documents' ``logger = get_logger()``)."""

from __future__ import annotations

import logging

FORMAT = '%(asctime)s %(levelname)s %(name)s: %(message)s'


def get_logger(name: str = 'twinkle', level: int = logging.INFO) -> logging.Logger:
    """A logger under ``twinkle``; the first call gives ``twinkle`` a console handler at `level` unless the
    application configured logging already (the root logger has handlers)."""
    root = logging.getLogger('twinkle')
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    return logging.getLogger(name if name == 'twinkle' or name.startswith('twinkle.') else f'twinkle.{name}')
