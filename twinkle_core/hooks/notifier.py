"""Alerts when a training job fails: `WebhookNotifier`, a ``twinkle_failure`` hook implementation.

    twinkle_core.initialize('local', notifier='https://hooks.example.com/twinkle')            # generic JSON
    twinkle_core.initialize('local', notifier={'url': DINGTALK_ROBOT_URL, 'format': 'dingtalk', 'secret': SEC})

Every ``twinkle_failure`` (a model method that raised, a failed server request) and, once installed by
`initialize`, every exception that ends the script uncaught is POSTed to `url`, at most once per exception object:

- ``format='json'``: ``{"event": "twinkle_failure", "title", "error_type", "message", "context", "host", "pid",
  "time"}``;
- ``format='dingtalk'``: the DingTalk custom-robot message ``{"msgtype": "markdown", "markdown": {"title",
  "text"}}``; with the robot's signing `secret`, the URL gets ``timestamp`` and ``sign`` (HMAC-SHA256, base64) as
  DingTalk requires.

Posting never raises into the training job: failures to deliver are logged (``twinkle.notifier`` logger) and the
job goes on (or exits) as it would have. Standard library only (urllib), `timeout_s` per post.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import socket
import sys
import time
import traceback
import urllib.parse
import urllib.request
from types import TracebackType
from typing import Any, Callable

from twinkle_core.hooks.emit import emit_failure
from twinkle_core.hooks.manager import get_plugin_manager, hook, register_hooks, unregister_hooks
from twinkle_core.utils.json import to_json

logger = logging.getLogger('twinkle.notifier')
FORMATS = ('json', 'dingtalk')
_REPORTED = '__twinkle_notified__'
_REGISTERED_NAME = 'twinkle-notifier'


class WebhookNotifier:
    """POSTs an alert for every failure to `url` (see the module docstring for the formats)."""

    def __init__(
        self,
        url: str,
        *,
        format: str = 'json',
        secret: str | None = None,
        title: str = 'twinkle job failed',
        timeout_s: float = 5.0,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ('http', 'https') or not parsed.netloc:
            raise ValueError(f'notifier url must be an http(s) URL, got {url!r}.')
        if format not in FORMATS:
            raise ValueError(f'unknown notifier format {format!r}; choose one of {", ".join(FORMATS)}.')
        if secret is not None and format != 'dingtalk':
            raise ValueError("a signing secret is only used by format='dingtalk'.")
        self.url, self.format, self.secret, self.title, self.timeout_s = url, format, secret, title, timeout_s

    @hook
    def twinkle_failure(self, exc: BaseException, context: dict[str, Any]) -> None:
        if getattr(exc, _REPORTED, False):
            return
        try:
            setattr(exc, _REPORTED, True)
        except AttributeError:  # exceptions with __slots__: report, without the once-only mark
            pass
        self.send(exc, context)

    def send(self, exc: BaseException, context: dict[str, Any]) -> bool:
        """POST one alert; returns whether the receiver answered 2xx. Never raises."""
        body = self.payload(exc, context)
        request = urllib.request.Request(
            self._signed_url(),
            data=json.dumps(body).encode(),
            method='POST',
            headers={'Content-Type': 'application/json'},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return 200 <= response.status < 300
        except Exception as err:  # noqa: BLE001 - an alert must never break (or hide) the failure itself
            logger.warning('could not deliver the failure alert to %s: %s', _redacted(self.url), err)
            return False

    def payload(self, exc: BaseException, context: dict[str, Any]) -> dict[str, Any]:
        """The JSON body for `exc` in this notifier's format."""
        message = str(exc) or type(exc).__name__
        context = to_json(context)
        if self.format == 'json':
            return {
                'event': 'twinkle_failure',
                'title': self.title,
                'error_type': type(exc).__name__,
                'message': message,
                'context': context,
                'host': socket.gethostname(),
                'pid': os.getpid(),
                'time': time.time(),
            }
        lines = [
            f'### {self.title}',
            f'**{type(exc).__name__}**: {message}',
            f'- host: {socket.gethostname()} (pid {os.getpid()})',
        ]
        lines += [f'- {key}: {value}' for key, value in context.items()]
        return {'msgtype': 'markdown', 'markdown': {'title': self.title, 'text': '\n'.join(lines)}}

    def _signed_url(self) -> str:
        if not self.secret:
            return self.url
        timestamp = str(int(time.time() * 1000))
        digest = hmac.new(self.secret.encode(), f'{timestamp}\n{self.secret}'.encode(), hashlib.sha256).digest()
        sign = urllib.parse.quote_plus(base64.b64encode(digest).decode())
        return f'{self.url}{"&" if "?" in self.url else "?"}timestamp={timestamp}&sign={sign}'


def notifier_from(spec: Any) -> Any:
    """A notifier from `initialize(notifier=...)`: a URL, a dict of `WebhookNotifier` arguments, or any object
    implementing the ``twinkle_failure`` hook (returned as is)."""
    if isinstance(spec, str):
        return WebhookNotifier(spec)
    if isinstance(spec, dict):
        return WebhookNotifier(**spec)
    if callable(getattr(spec, 'twinkle_failure', None)):
        return spec
    raise TypeError(
        f'notifier must be a URL, a dict of WebhookNotifier arguments or an object with a '
        f'twinkle_failure hook, got {type(spec).__name__}.'
    )


_previous_excepthook: Callable[..., Any] | None = None


def install_notifier(spec: Any) -> Any:
    """Register the notifier for `spec` (replacing one installed before; None removes it) and report exceptions
    that end the script uncaught to it as well. Returns the notifier (or None)."""
    global _previous_excepthook
    if get_plugin_manager().get_plugin(_REGISTERED_NAME) is not None:
        unregister_hooks(name=_REGISTERED_NAME)
    if spec is None:
        if _previous_excepthook is not None:
            sys.excepthook, _previous_excepthook = _previous_excepthook, None
        return None
    notifier = notifier_from(spec)
    register_hooks(notifier, name=_REGISTERED_NAME)
    if _previous_excepthook is None:
        _previous_excepthook, sys.excepthook = sys.excepthook, _report_uncaught
    return notifier


def _report_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if not issubclass(kind, KeyboardInterrupt):
        where = traceback.extract_tb(tb)[-1] if tb is not None else None
        emit_failure(
            exc,
            {
                'where': 'uncaught',
                'script': sys.argv[0] if sys.argv else '',
                'at': f'{where.filename}:{where.lineno}' if where else '',
            },
        )
    (_previous_excepthook or sys.__excepthook__)(kind, exc, tb)


def _redacted(url: str) -> str:
    """The URL without its query (robot tokens live there)."""
    return urllib.parse.urlparse(url)._replace(query='', fragment='').geturl()
