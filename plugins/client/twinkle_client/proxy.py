"""Remote proxies built from the interface declarations (`twinkle_core.dispatch.remote_methods`).

No hand-written mirror: every method a `Model` / `Sampler` declares with `@remote_method` becomes a method of
the proxy that posts `{args, kwargs}` to `/twinkle/v1/<models|samplers>/<id>/call/<method>`; the server
whitelists the same set. Arguments are sent as JSON (pydantic models as dicts, arrays as lists, float arrays of
2+ dimensions as base64, see `twinkle_core.utils.arrays`): batches are encoded client-side (InputFeature rows), so
no torch is needed here.
"""

from __future__ import annotations

from typing import Any, Callable

from twinkle_core.dispatch import remote_methods
from twinkle_core.errors import InvalidInputError
from twinkle_core.utils.arrays import pack_array
from twinkle_core.utils.json import to_json


def plain(value: Any) -> Any:
    """JSON-ready copy of call arguments (`to_json`, None fields dropped; float arrays of 2+ dimensions, such as
    an image row's ``pixel_values``, packed as base64 by `pack_array`, which the server unpacks); objects with no
    JSON form are refused rather than sent as text: the server would not know what to make of them."""
    return to_json(value, exclude_none=True, default=_refuse, pack=pack_array)


def _refuse(value: Any) -> Any:
    raise InvalidInputError(
        f'cannot send a {type(value).__name__} to the server; pass names of registered '
        f'components and plain data (lists, dicts, numbers, strings)'
    )


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
