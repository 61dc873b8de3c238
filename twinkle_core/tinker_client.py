"""`init_tinker_client`: prepare the official ``tinker`` SDK for a twinkle server (the Twinkle documents call it
before ``from tinker import ServiceClient``).

A twinkle server speaks the Tinker wire API, so the SDK needs no patching: this checks that ``tinker`` is
installed and, when given, puts the server's address and key where the SDK reads its defaults
(``TINKER_BASE_URL``, ``TINKER_API_KEY``), so ``ServiceClient()`` needs no arguments.
"""

from __future__ import annotations

import os
from typing import Any

from twinkle_core.errors import TwinkleError


def init_tinker_client(base_url: str | None = None, api_key: str | None = None) -> Any:
    """Returns the ``tinker`` module. Raises `TwinkleError` with the install line when it is missing."""
    try:
        import tinker
    except ImportError as exc:
        raise TwinkleError(f'The Tinker SDK is not installed ({exc}). Run: pip install tinker') from exc
    if base_url is not None:
        os.environ['TINKER_BASE_URL'] = base_url
    if api_key is not None:
        os.environ['TINKER_API_KEY'] = api_key
    return tinker
