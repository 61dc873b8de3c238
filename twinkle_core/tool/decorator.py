"""`@tool`: a typed, documented Python function as a `Tool`, and the argument check every tool call goes through.

The JSON schema comes from the type hints (str, int, float, bool, list[...], dict[str, ...], Literal[...],
Optional[...] / ``X | None``, Annotated[X, 'description'], Any); a parameter with a default is not required. The
tool's description is the docstring's text before its first section, each parameter's description its line in the
Google-style ``Args:`` section. `validate_arguments` checks a call's arguments against a schema: missing required
keys, unknown keys and wrong JSON types raise `ToolError` naming the tool and the argument.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Sequence, overload

from twinkle_core.tool.access import PathDeclaration, check_access
from twinkle_core.tool.base import Tool, ToolError

__all__ = ['FunctionTool', 'json_schema_of', 'parse_docstring', 'tool', 'validate_arguments']

_SCALARS: dict[type, str] = {str: 'string', bool: 'boolean', int: 'integer', float: 'number'}
_SECTION = re.compile(r'^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|See Also):\s*$')
_ARG_LINE = re.compile(r'^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$')


def json_schema_of(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a type hint; raises TypeError for a type JSON cannot carry."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return {}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = json_schema_of(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**schema, 'description': notes[0]} if notes else schema
    if origin is Literal:
        kinds = {_SCALARS.get(type(v)) for v in args}
        kind = kinds.pop() if len(kinds) == 1 else None
        return {'type': kind, 'enum': list(args)} if kind else {'enum': list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        inner = json_schema_of(members[0]) if len(members) == 1 else {'anyOf': [json_schema_of(m) for m in members]}
        if len(members) == len(args):
            return inner
        if isinstance(inner.get('type'), str):
            return {**inner, 'type': [inner['type'], 'null']}
        return {'anyOf': [inner, {'type': 'null'}]}
    if annotation in _SCALARS:
        return {'type': _SCALARS[annotation]}
    if annotation in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        item = args[0] if args and (origin is not tuple or len(args) == 1 or args[1] is Ellipsis) else Any
        return {'type': 'array', 'items': json_schema_of(item)} if item is not Any else {'type': 'array'}
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f'dict keys must be str in a tool signature, got {annotation!r}')
        return {'type': 'object', 'additionalProperties': json_schema_of(args[1])} if args else {'type': 'object'}
    raise TypeError(f'{annotation!r} has no JSON schema; use str, int, float, bool, list, dict, Literal or Optional')


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a Google-style docstring."""
    lines = inspect.cleandoc(doc or '').splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    params_indent = 0
    for line in lines:
        header = _SECTION.match(line.strip()) if not line.startswith((' ', '\t')) else None
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            summary.append(line)
        elif section in ('Args', 'Arguments', 'Parameters', 'Params') and line.strip():
            match = _ARG_LINE.match(line.strip())
            indent = len(line) - len(line.lstrip())
            if match and (current is None or indent <= params_indent):
                current, params_indent = match.group(1), indent
                params[current] = match.group(2).strip()
            elif current is not None:
                params[current] = f'{params[current]} {line.strip()}'.strip()
    description = ' '.join(' '.join(summary).split())
    return description, params


def _check(value: Any, schema: dict[str, Any], path: str) -> Any:
    """`value` (at `path`, '' for the arguments object) checked against `schema` (the subset `json_schema_of`
    produces); an integral float becomes an int where an integer is wanted, an int a float where a number is."""
    where = f'argument {path!r}' if path else 'arguments'
    if 'enum' in schema and value not in schema['enum']:
        raise ToolError(f'{where} must be one of {schema["enum"]!r}, got {value!r}')
    if 'anyOf' in schema:
        for option in schema['anyOf']:
            try:
                return _check(value, option, path)
            except ToolError:
                pass
        raise ToolError(f'{where} matches none of the allowed types, got {_describe(value)}')
    wanted = schema.get('type')
    if wanted is None:
        return value
    for kind in [wanted] if isinstance(wanted, str) else wanted:
        if kind == 'null' and value is None:
            return None
        if kind == 'string' and isinstance(value, str):
            return value
        if kind == 'boolean' and isinstance(value, bool):
            return value
        if kind == 'integer' and not isinstance(value, bool):
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
        if kind == 'number' and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if kind == 'array' and isinstance(value, list | tuple):
            items = schema.get('items', {})
            return [_check(v, items, f'{path}[{i}]') for i, v in enumerate(value)]
        if kind == 'object' and isinstance(value, dict):
            return _check_object(value, schema, path)
    names = wanted if isinstance(wanted, str) else ' or '.join(wanted)
    article = 'an' if names[0] in 'aeiou' else 'a'
    raise ToolError(f'{where} must be {article} {names}, got {_describe(value)}')


def _check_object(value: dict[str, Any], schema: dict[str, Any], path: str) -> dict[str, Any]:
    properties: dict[str, Any] = schema.get('properties', {})
    extra = schema.get('additionalProperties', 'properties' not in schema)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ToolError(f'non-string key {key!r} in {f"argument {path!r}" if path else "arguments"}')
        inner = f'{path}.{key}' if path else key
        if key in properties:
            out[key] = _check(item, properties[key], inner)
        elif extra is False:
            expected = ', '.join(properties) or 'none'
            raise ToolError(f'unknown argument {inner!r} (expected: {expected})')
        else:
            out[key] = _check(item, extra, inner) if isinstance(extra, dict) else item
    missing = [f'{path}.{k}' if path else k for k in schema.get('required', []) if k not in value]
    if missing:
        raise ToolError(f'missing required argument{"s" if len(missing) > 1 else ""} {", ".join(map(repr, missing))}')
    return out


def _describe(value: Any) -> str:
    kind = {str: 'string', bool: 'boolean', int: 'integer', float: 'number', list: 'array', dict: 'object'}
    text = repr(value)
    return f'{kind.get(type(value), type(value).__name__)} {text if len(text) <= 40 else text[:37] + "..."}'


def validate_arguments(schema: dict[str, Any], arguments: Any, tool_name: str = '') -> dict[str, Any]:
    """`arguments` checked against the tool's parameter `schema`, with integral floats made ints where an integer
    is wanted. Keys the schema does not list are refused unless it sets ``additionalProperties``. Raises
    `ToolError`: "bad arguments for tool 'NAME': WHAT"."""
    try:
        if not isinstance(arguments, dict):
            raise ToolError(f'arguments must be a JSON object, got {_describe(arguments)}')
        return _check_object(arguments, {'additionalProperties': False, **schema}, '')
    except ToolError as exc:
        raise ToolError(f'bad arguments for tool {tool_name!r}: {exc}') from None


class FunctionTool(Tool):
    """A `Tool` made from a function by `tool`: checks the arguments against `parameters`, calls the function and
    returns its result as text (a str as is, None as '', anything else as `str()`). Each function gets its own
    subclass, whose class attributes `name`, `description` and `parameters` describe it. `network`, `paths` and
    `env`: what its sandboxed calls may reach (`Tool`), checked here (`InvalidInputError` naming the tool)."""

    fn: Callable[..., Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        timeout_s: float | None = None,
        sandboxed: bool | None = None,
        network: bool = False,
        paths: Sequence[PathDeclaration] = (),
        env: Sequence[str] = (),
    ):
        self.fn = fn
        if timeout_s is not None:
            self.timeout_s = float(timeout_s)
        if sandboxed is not None:
            self.sandboxed = bool(sandboxed)
        access = check_access(self.name or getattr(fn, '__name__', repr(fn)), network, paths, env)
        self.network, self.paths, self.env = access.network, access.paths, access.env
        functools.update_wrapper(self, fn, updated=())

    @classmethod
    def from_callable(cls, fn: Callable[..., Any], **options: Any) -> FunctionTool:
        """What the registry calls for ``resolve('tool', fn)`` (kinds.KIND_INTERFACES): `from_function`."""
        return cls.from_function(fn, **options)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        sandboxed: bool | None = None,
        network: bool = False,
        paths: Sequence[PathDeclaration] = (),
        env: Sequence[str] = (),
    ) -> FunctionTool:
        """The tool for `fn` (its schema built from the signature and docstring; TypeError for an untyped-able
        parameter, ``*args`` or ``**kwargs``; `InvalidInputError` for a malformed `network`, `paths` or `env`)."""
        summary, docs = parse_docstring(fn.__doc__)
        hints = typing.get_type_hints(fn, include_extras=True)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
                raise TypeError(f'tool {fn.__name__!r}: parameter {param.name!r} must be a plain keyword parameter')
            try:
                schema = json_schema_of(hints.get(param.name, Any))
            except TypeError as exc:
                raise TypeError(f'tool {fn.__name__!r}, parameter {param.name!r}: {exc}') from None
            if param.name in docs and 'description' not in schema:
                schema['description'] = docs[param.name]
            if param.default is param.empty:
                required.append(param.name)
            elif param.default is None or isinstance(param.default, str | int | float | bool):
                schema['default'] = param.default
            properties[param.name] = schema
        parameters: dict[str, Any] = {'type': 'object', 'properties': properties, 'required': required}
        attrs = {'name': name or fn.__name__, 'description': description or summary, 'parameters': parameters}
        subclass = type(f'{fn.__name__}_tool', (cls,), {**attrs, '__module__': fn.__module__})
        return subclass(fn, timeout_s=timeout_s, sandboxed=sandboxed, network=network, paths=paths, env=env)

    def __call__(self, **arguments: Any) -> str:
        result = self.fn(**validate_arguments(self.parameters, arguments, self.name))
        return '' if result is None else result if isinstance(result, str) else str(result)

    def __reduce__(self) -> tuple[Any, ...]:
        # By import path when the decorated function's module attribute is this tool (a worker process imports
        # it); otherwise rebuilt from the function (pickled by reference, or by value through cloudpickle).
        module, qualname = getattr(self, '__module__', ''), getattr(self, '__qualname__', '')
        if module not in ('', '__main__') and '<locals>' not in qualname:
            try:
                if _import_attr(module, qualname) is self:
                    return _import_attr, (module, qualname)
            except (ImportError, AttributeError):
                pass
        options = {'name': self.name, 'description': self.description, 'timeout_s': self.timeout_s}
        access = {'network': self.network, 'paths': self.paths, 'env': self.env}
        return _rebuild, (self.fn, {**options, 'sandboxed': self.sandboxed, **access})


def _import_attr(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split('.'):
        obj = getattr(obj, part)
    return obj


def _rebuild(fn: Callable[..., Any], options: dict[str, Any]) -> FunctionTool:
    return FunctionTool.from_function(fn, **options)


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    sandboxed: bool | None = None,
    network: bool = False,
    paths: Sequence[PathDeclaration] = (),
    env: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    sandboxed: bool | None = None,
    network: bool = False,
    paths: Sequence[PathDeclaration] = (),
    env: Sequence[str] = (),
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed, documented function into a `Tool`: ``@tool`` or ``@tool(name=..., timeout_s=...,
    sandboxed=..., network=..., paths=..., env=...)``. Defaults: the function's name, its docstring's summary,
    `Tool.timeout_s`, sandboxed, and no access beyond the sandbox. `network`, `paths` and `env` declare what its
    sandboxed calls may reach (see `Tool`): e.g. ``@tool(network=True, paths=[('/data', 'ro')], env=['HF_TOKEN'])``;
    a malformed declaration raises `InvalidInputError` here."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        options: dict[str, Any] = {'name': name, 'description': description}
        access: dict[str, Any] = {'network': network, 'paths': paths, 'env': env}
        return FunctionTool.from_function(f, **options, timeout_s=timeout_s, sandboxed=sandboxed, **access)

    return wrap(fn) if fn is not None else wrap
