"""Server configuration: hosted models, data directory, limits.

Limits come in one table (`Limits`) with built-in defaults sized for a small machine (2 cores, ~24 GiB: one
`forward_backward` of 32k tokens on a 0.6B model stays well inside memory). `--limits FILE` overrides them key by
key: `{"default": {...}, "tenants": {"alice": {...}}}`. The `default` entry overrides only the keys it names in
the built-in table, and a tenant's entry only the keys it names in the (overridden) default. `null` = unlimited.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TenantLimits:
    """Per-request and per-tenant caps; `None` = unlimited. Exceeding one answers a 4xx naming the cap and its
    value, before any large allocation (never 402). Caps a client can wait out answer 429 with Retry-After."""
    # ---- per request ----
    max_tokens_per_request: int | None = 32768  # tokens summed over a forward_backward's datums
    max_rows_per_request: int | None = 1024  # datums of one forward_backward
    max_num_samples: int | None = 64  # num_samples of one sample request
    max_sample_tokens: int | None = 4096  # max_tokens of one sample request (also bounded by the context)
    # ---- per tenant ----
    max_adapters: int | None = 8  # live training models at once (not waitable: 403)
    max_lora_rank: int | None = 128
    max_sessions: int | None = 64  # unfinished sessions (not waitable: 403; finish one first)
    max_pending_futures: int | None = 64  # requests queued or running at once (waitable: 429 + Retry-After)
    requests_per_minute: int | None = None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def merged(self, overrides: dict[str, Any], where: str = 'limits') -> 'TenantLimits':
        """A copy with only the keys named in `overrides` replaced (each a non-negative int or null)."""
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(f'{where}: unknown limit(s) {unknown}; known: {", ".join(self.names())}')
        for key, value in overrides.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f'{where}: {key} must be a non-negative integer or null (unlimited), got {value!r}')
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> 'TenantLimits':
        """The built-in defaults with `d`'s keys replaced."""
        return cls().merged(d)


@dataclass
class ServerConfig:
    """`models`: public name -> local directory (or a `ms://`/`hf://` id resolved at start-up)."""
    models: dict[str, str]
    data_dir: str
    host: str = '127.0.0.1'
    port: int = 8000
    max_body_bytes: int = 64 * 1024 * 1024
    long_poll_s: float = 30.0
    max_queued_samples: int = 256
    max_batch: int = 16
    session_ttl_s: float = 30 * 60
    #: how long work of a training model may wait for a missing earlier seq_id before it is failed
    seq_gap_timeout_s: float = 120.0
    #: failed logins from one address within a minute before that address is answered 429
    max_failed_logins_per_minute: int = 30
    #: directories (besides each hosted model's own) whose files native calls may name (e.g. set_template)
    allowed_roots: tuple[str, ...] = ()
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    lora_alpha: float = 32.0
    #: the training backend of every hosted model, by registry name (kind `model`), and its constructor
    #: arguments (e.g. ``{'pass_strategy': 'mixed'}`` for MultiLoraTransformersModel: how queued work of several
    #: adapters splits into passes)
    backend: str = 'MultiLoraTransformersModel'
    backend_args: dict[str, Any] = field(default_factory=dict)
    #: the sampler serving Tinker sampling, by registry name (kind `sampler`), and its constructor arguments
    #: (e.g. ``{'engine_args': {'max_model_len': 4096}}`` for vLLMSampler)
    sampler: str = 'TorchSampler'
    sampler_args: dict[str, Any] = field(default_factory=dict)

    def limits(self, tenant: str) -> TenantLimits:
        return self.tenant_limits.get(tenant, self.default_limits)

    @staticmethod
    def parse_model(spec: str) -> tuple[str, str]:
        """`NAME=PATH` (serve PATH under the public alias NAME) or just `PATH` (its own name)."""
        if '=' in spec:
            name, path = spec.split('=', 1)
            if not name or not path:
                raise ValueError(f'--model {spec!r}: expected NAME=PATH')
            return name, path
        return spec.rstrip('/').split('/')[-1] if Path(spec).exists() else spec, spec

    @staticmethod
    def parse_json_object(text: str, option: str = '--sampler-args') -> dict[str, Any]:
        """`--sampler-args` / `--backend-args`: a JSON object."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f'{option}: not valid JSON: {exc}') from None
        if not isinstance(value, dict):
            raise ValueError(f'{option}: expected a JSON object, got {type(value).__name__}')
        return value

    @staticmethod
    def load_limits(path: str | None) -> tuple[TenantLimits, dict[str, TenantLimits]]:
        """A JSON file `{"default": {...}, "tenants": {"name": {...}}}`, merged key by key (module docstring)."""
        if not path:
            return TenantLimits(), {}
        try:
            raw = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f'--limits {path}: not valid JSON: {exc}') from None
        if not isinstance(raw, dict) or set(raw) - {'default', 'tenants'}:
            raise ValueError(f'--limits {path}: expected {{"default": {{...}}, "tenants": {{"name": {{...}}}}}}')
        default = TenantLimits().merged(raw.get('default') or {}, f'--limits {path} default')
        tenants = {name: default.merged(entry or {}, f'--limits {path} tenants.{name}')
                   for name, entry in (raw.get('tenants') or {}).items()}
        return default, tenants
