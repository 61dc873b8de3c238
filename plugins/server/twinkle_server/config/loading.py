"""Loading a config file: `twinkle server start --config FILE`, one YAML file -> a validated `ServerConfig`
(docs/deployment.md).

`load_server_config(path, overrides)` reads the file with the line of every key (`yaml_lines`), checks every key
against the schema (`schema`) and collects every problem as `FILE:LINE: key.path: what is wrong (what is expected)`
into one `ConfigError`: unknown keys (with the closest known one), wrong types, out-of-range values, missing required
keys, duplicate model names, backends and samplers that are not installed, a training group of several ranks for a
backend that does not declare it takes a mesh (its `ModelCapabilities.takes_device_mesh`), model paths that are
neither a directory nor an `ms://` / `hf://` id, limits, and settings the chosen deployment mode cannot honour.
Backend arguments are checked against the backend's declarations when its host is built
(`model_host.construction.build_backend`).
Relative paths are relative to the file's directory (to the working directory for values given on the command
line). Defaults live on the dataclasses in `settings`: only keys the file names are passed on.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Sequence

from twinkle_core.errors import HubError
from twinkle_core.hub.ref import HubRef, is_hub_ref
from twinkle_server.config.model_checks import InstalledModels
from twinkle_server.config.model_settings import DeploymentConfig, GroupSpec, HubPushConfig, ModelSpec, RayConfig
from twinkle_server.config.options import keys_of
from twinkle_server.config.rules import AMOUNT, PROXY, Rule, text_rule, wrong_type
from twinkle_server.config.schema import (
    AUTH,
    DEPLOYMENT,
    HUB_PUSH,
    LIMIT_VALUES,
    LIMITS,
    MESH,
    MODEL,
    RAY,
    SAMPLER_GROUP,
    SERVER,
    STORAGE,
    TOP,
    TRAIN_GROUP,
)
from twinkle_server.config.settings import ServerConfig, TenantLimits
from twinkle_server.config.yaml_lines import ConfigError, Document, KeyPath, read_document
from twinkle_server.store.db.base import DatabaseError
from twinkle_server.store.db.url import parse_url

__all__ = ['ConfigError', 'describe', 'load_server_config', 'load_storage']


def load_server_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> ServerConfig:
    """The `ServerConfig` of the file at `path`, with `overrides` (values in the file's own shape, e.g.
    ``{'server': {'port': 9000}, 'models': {'device': 'cpu'}}``; `yaml_lines.Document.apply`) laid over it.
    Raises `ConfigError` listing every problem."""
    doc = read_document(path)
    doc.apply(overrides)
    return _Checker(doc, Path(path).resolve().parent).build()


def load_storage(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> tuple[str, str | None]:
    """(data_dir, database_url) of the file's `storage` section, read and checked as `load_server_config` reads it,
    with `overrides` (``{'data_dir': ..., 'database_url': ...}``, command-line values) laid over it; the rest of the
    file is not checked (`twinkle server keys --config FILE` needs only the store). Raises `ConfigError`."""
    doc = read_document(path)
    doc.apply({'storage': overrides} if overrides else None)
    checker = _Checker(doc, Path(path).resolve().parent)
    storage = checker.storage(checker.top().get('storage'))
    if checker.errors:
        raise ConfigError(sorted(checker.errors, key=_line_of))
    return storage['data_dir'], storage.get('database_url')


def describe(config: ServerConfig) -> str:
    """One line for `twinkle server config check`: ``2 models: a, b; deployment: ray (address auto)``."""
    names = ', '.join(config.model_specs)
    mode = config.deployment.mode
    if mode == 'ray':
        address = config.deployment.ray.address
        mode += f' (address {address})' if address else ' (a local Ray instance)'
    count = len(config.model_specs)
    return f'{count} model{"s" if count != 1 else ""}: {names}; deployment: {mode}'


class _Checker:
    """Walks a `Document` once, collecting errors and the keyword arguments of the config dataclasses."""

    def __init__(self, doc: Document, base_dir: Path) -> None:
        self.doc, self.base_dir = doc, base_dir
        self.errors: list[str] = []
        self.models_here = InstalledModels()  # what this installation's registry resolves (cached)

    def top(self) -> dict[str, Any]:
        """The file's known top-level sections; raises `ConfigError` for an empty file."""
        if self.doc.values is None:
            raise ConfigError([self.doc.message((), 'the file is empty', 'a mapping with at least storage and models')])
        return self.mapping(self.doc.values, (), TOP, required=True)

    def build(self) -> ServerConfig:
        top = self.top()
        server = self.fields(top.get('server'), ('server',), SERVER)
        server = {
            key.field: key.to_field(server[key.name]) for key in keys_of(ServerConfig, 'server') if key.name in server
        }
        if 'allowed_roots' in server:
            server['allowed_roots'] = tuple(self.directories(server['allowed_roots'], ('server', 'allowed_roots')))
        if 'trusted_proxies' in server:
            server['trusted_proxies'] = tuple(
                proxy
                for i, proxy in enumerate(server['trusted_proxies'])
                if self.check(proxy, ('server', 'trusted_proxies', i), PROXY)
            )
        storage = self.storage(top.get('storage'))
        self.fields(top.get('auth'), ('auth',), AUTH)
        default, tenants = self.limits(top.get('limits'), ('limits',))
        deployment = self.deployment(top.get('deployment'), ('deployment',))
        hub_push = self.hub_push(top.get('hub_push'), ('hub_push',), None)
        specs = self.models(top.get('models'), ('models',), deployment, hub_push)
        if self.errors:
            raise ConfigError(sorted(self.errors, key=_line_of))
        return ServerConfig(
            models={},
            **storage,
            **server,
            default_limits=default,
            tenant_limits=tenants,
            deployment=deployment,
            hub_push=hub_push,
            model_specs=specs,
        )

    # ---- primitives ----------------------------------------------------------------------------------------------
    def error(self, path: KeyPath, problem: str, expected: str | None = None, note: str | None = None) -> None:
        self.errors.append(self.doc.message(path, problem, expected, note))

    def check(self, value: Any, path: KeyPath, rule: Rule) -> bool:
        problem = rule.problem_with(value)
        if problem:
            self.error(path, problem, rule.expected)
        return problem is None

    def mapping(self, value: Any, path: KeyPath, known: Sequence[str], required: bool = False) -> dict[str, Any]:
        """`value`'s known keys (an absent section is empty); wrong types and unknown keys are errors."""
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            self.error(path, wrong_type(value), f'a mapping with keys {", ".join(known)}')
            return {}
        for key in value:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                if close:
                    self.error(path + (key,), 'unknown key', note=f'did you mean {close[0]}?')
                else:
                    self.error(path + (key,), 'unknown key', f'one of: {", ".join(known)}')
        return {key: sub for key, sub in value.items() if key in known}

    def fields(self, value: Any, path: KeyPath, rules: dict[str, Rule], required: Sequence[str] = ()) -> dict:
        """The keys of section `value` that pass their rules; a missing `required` key is an error."""
        section = self.mapping(value, path, list(rules))
        missing = [key for key in required if section.get(key) is None]
        for key in missing:
            self.error(path + (key,), 'missing', rules[key].expected)
        return {
            key: sub
            for key, sub in section.items()
            if key not in missing and self.check(sub, path + (key,), rules[key])
        }

    def local_path(self, value: str, path: KeyPath) -> str:
        """`value` made absolute against the file's directory (the working directory for command-line values)."""
        base = Path.cwd() if self.doc.from_command_line(path) else self.base_dir
        return str((base / os.path.expanduser(value)).resolve())

    # ---- sections ------------------------------------------------------------------------------------------------
    def storage(self, value: Any) -> dict[str, Any]:
        """`storage`: data_dir (required, made absolute) and database_url (a relative SQLite path made absolute)."""
        storage = self.fields(value, ('storage',), STORAGE, required=('data_dir',))
        if 'data_dir' in storage:
            storage['data_dir'] = self.local_path(storage['data_dir'], ('storage', 'data_dir'))
        if storage.get('database_url'):
            storage['database_url'] = self.database_url(storage['database_url'], ('storage', 'database_url'))
        return storage

    def directories(self, values: list[Any], path: KeyPath) -> list[str]:
        out = []
        for i, item in enumerate(values):
            if self.check(item, path + (i,), text_rule('an existing directory')):
                resolved = self.local_path(item, path + (i,))
                if Path(resolved).is_dir():
                    out.append(resolved)
                else:
                    self.error(path + (i,), f'{resolved} is not a directory', 'an existing directory')
        return out

    def database_url(self, url: str, path: KeyPath) -> str:
        """`url` as the store reads it (`db.url.parse_url`); a relative `sqlite:///PATH` made absolute like every
        other path in the file."""
        try:
            kind, target = parse_url(url)
        except DatabaseError as exc:
            self.error(path, str(exc))
            return url
        if kind == 'sqlite' and target != ':memory:' and not Path(target).is_absolute():
            return 'sqlite:///' + self.local_path(target, path)
        return url

    def limits(self, value: Any, path: KeyPath) -> tuple[TenantLimits, dict[str, TenantLimits]]:
        """`{default: {...}, tenants: {name: {...}}}`, merged key by key as a `--limits` file is."""
        section = self.mapping(value, path, LIMITS)
        default = TenantLimits().merged(self.limit_values(section.get('default'), path + ('default',)))
        tenants = {}
        named = section.get('tenants')
        if named is not None and self.check(
            named, path + ('tenants',), Rule((dict,), 'a mapping of tenant names to limits')
        ):
            for name, entry in named.items():
                tenants[name] = default.merged(self.limit_values(entry, path + ('tenants', name)))
        return default, tenants

    def limit_values(self, value: Any, path: KeyPath) -> dict[str, Any]:
        return self.fields(value, path, LIMIT_VALUES)

    def deployment(self, value: Any, path: KeyPath) -> DeploymentConfig:
        section = self.fields(value, path, DEPLOYMENT)
        ray = self.fields(section.pop('ray', None), path + ('ray',), RAY)
        if ray.get('address') and ray.get('num_cpus') is not None:
            self.error(
                path + ('ray', 'num_cpus'),
                'only for a Ray instance the server starts (address: null)',
                note='a running cluster has its own resources; leave num_cpus out',
            )
        if section.get('mode') == 'ray' and importlib.util.find_spec('twinkle_ray') is None:
            self.error(
                path + ('mode',),
                'ray needs the Ray runtime, which is not installed',
                'twinkle-ray installed: pip install twinkle-ray',
            )
        return DeploymentConfig(**section, ray=RayConfig(**ray))

    def hub_push(self, value: Any, path: KeyPath, base: HubPushConfig | None) -> HubPushConfig | None:
        """The settings of section `value` laid over `base` (None when neither is given)."""
        if value is None:
            return base
        section = self.fields(value, path, HUB_PUSH)
        merged = dataclasses.replace(base or HubPushConfig(), **section)
        if merged.enabled and not merged.repo_prefix:
            self.error(
                path + ('repo_prefix',),
                'missing while pushing is enabled',
                "a prefix of the hub repositories, e.g. 'my-org/twinkle-'",
            )
        return merged

    def models(
        self, value: Any, path: KeyPath, deployment: DeploymentConfig, hub_push: HubPushConfig | None
    ) -> dict[str, ModelSpec]:
        if value is None or value == []:
            self.error(path, 'missing', 'a list of models, each with at least name and path')
            return {}
        if not self.check(value, path, Rule((list,), 'a list of models, each with at least name and path')):
            return {}
        specs: dict[str, ModelSpec] = {}
        first: dict[str, int] = {}
        for i, entry in enumerate(value):
            spec = self.model(entry, path + (i,), deployment, hub_push)
            if spec is None:
                continue
            if spec.name in first:
                self.error(
                    path + (i, 'name'),
                    f'duplicate model name {spec.name!r}',
                    f'each name once; models[{first[spec.name]}] already has it',
                )
                continue
            first[spec.name] = i
            specs[spec.name] = spec
        return specs

    def model(
        self, value: Any, path: KeyPath, deployment: DeploymentConfig, hub_push: HubPushConfig | None
    ) -> ModelSpec | None:
        fields = self.fields(value, path, MODEL, required=('name', 'path') if isinstance(value, dict) else ())
        if 'path' in fields:
            fields['path'] = self.model_path(fields['path'], path + ('path',))
        for key, kind in (('backend', 'model'), ('sampler', 'sampler')):
            if key in fields:
                self.component(kind, fields[key], path + (key,))
        train = self.fields(fields.pop('train_group', None), path + ('train_group',), TRAIN_GROUP)
        sampler = self.fields(fields.pop('sampler_group', None), path + ('sampler_group',), SAMPLER_GROUP)
        if 'ranks_per_replica' in sampler:
            sampler['ranks'] = sampler.pop('ranks_per_replica')
        for key, group in (('train_group', train), ('sampler_group', sampler)):
            if group.get('resources') is not None:
                group['resources'] = {
                    name: amount
                    for name, amount in group['resources'].items()
                    if self.check(amount, path + (key, 'resources', name), AMOUNT)
                } or None
            if group.get('device_type') is not None:
                group['device_type'] = {'gpu': 'cuda'}.get(group['device_type'].lower(), group['device_type'].lower())
        if fields.get('mesh') is not None:
            fields['mesh'] = self.fields(fields['mesh'], path + ('mesh',), MESH) or None
        fields['hub_push'] = self.hub_push(fields.pop('hub_push', None), path + ('hub_push',), hub_push)
        if 'name' not in fields or 'path' not in fields:
            return None
        spec = ModelSpec(**fields, train_group=GroupSpec(**train), sampler_group=GroupSpec(**sampler))
        self.placement(spec, path, deployment)
        return spec

    def model_path(self, value: str, path: KeyPath) -> str:
        if is_hub_ref(value):
            try:
                HubRef.parse(value)
            except HubError as exc:
                self.error(path, str(exc).rstrip('.'))
            return value
        resolved = self.local_path(value, path)
        if not Path(resolved).is_dir():
            self.error(
                path,
                f'{resolved} does not exist' if not Path(resolved).exists() else f'{resolved} is not a directory',
                'a local model directory or an ms:// / hf:// id',
            )
        return resolved

    def component(self, kind: str, name: str, path: KeyPath) -> None:
        """An error unless `name` resolves in the registry (kind `model` or `sampler`) of this installation."""
        problem = self.models_here.resolve_problem(kind, name)
        if problem:
            self.error(path, *problem)

    def placement(self, spec: ModelSpec, path: KeyPath, deployment: DeploymentConfig) -> None:
        """Mesh against train group; settings the deployment mode cannot honour."""
        for where, problem, expected, note in self.models_here.placement_problems(spec, deployment):
            self.error(path + where, problem, expected, note)


def _line_of(message: str) -> int:
    """Sort key of an error: its line (command-line values first)."""
    match = re.match(r'.*?:(\d+): ', message)
    return int(match.group(1)) if match else 0
