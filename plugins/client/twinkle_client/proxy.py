"""Remote proxies built from the interface declarations (`twinkle_core.dispatch.remote_methods`).

No hand-written mirror: every method a `Model` / `Sampler` declares with `@remote_method` becomes a method of
the proxy that posts `{args, kwargs}` to `/twinkle/v1/<models|samplers>/<id>/call/<method>`; the server
whitelists the same set. Arguments are sent as JSON (pydantic models as dicts, arrays as lists): batches are
encoded client-side (InputFeature rows), so no torch is needed here.
"""
from __future__ import annotations

import enum
from typing import Any, Callable

from twinkle_core.dispatch import remote_methods
from twinkle_core.errors import InvalidInputError


def plain(value: Any) -> Any:
    """JSON-ready copy of call arguments."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in (sorted(value, key=str) if isinstance(value, (set, frozenset)) else value)]
    dump = getattr(value, 'model_dump', None)
    if callable(dump):
        return plain(dump(exclude_none=True))
    to_dict = getattr(value, 'to_dict', None)  # e.g. peft.LoraConfig
    if callable(to_dict):
        return {k: v for k, v in plain(to_dict()).items() if v is not None}
    if isinstance(value, enum.Enum):
        return plain(value.value)
    tolist = getattr(value, 'tolist', None)
    if callable(tolist):
        return tolist()
    raise InvalidInputError(f'cannot send a {type(value).__name__} to the server; pass names of registered '
                            f'components and plain data (lists, dicts, numbers, strings)')


def build_methods(interface: type, call: Callable[..., Any], skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One function per remote method of `interface`, each forwarding to `call(self, name, args, kwargs)`."""
    methods: dict[str, Any] = {}
    for name in remote_methods(interface):
        if name in skip:
            continue
        doc = getattr(getattr(interface, name), '__doc__', None)

        def method(self: Any, *args: Any, __name: str = name, **kwargs: Any) -> Any:
            return call(self, __name, args, kwargs)

        method.__name__ = name
        method.__qualname__ = f'{interface.__name__}Proxy.{name}'
        method.__doc__ = f'(remote) {doc or ""}'
        methods[name] = method
    return methods


def remote_call(conn: Any, kind: str, ident: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    body = {'args': plain(list(args)), 'kwargs': plain(kwargs)}
    return conn.post(f'/twinkle/v1/{kind}/{ident}/call/{name}', body)['result']

