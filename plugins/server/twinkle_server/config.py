"""Server configuration: hosted models, data directory, limits."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TenantLimits:
    """Per-tenant caps; `None` = unlimited. Exceeding one answers a 4xx naming the limit (never 402)."""
    max_adapters: int | None = None  # live training models at once
    max_lora_rank: int | None = None
    requests_per_minute: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> 'TenantLimits':
        unknown = set(d) - {'max_adapters', 'max_lora_rank', 'requests_per_minute'}
        if unknown:
            raise ValueError(f'unknown tenant limit(s) {sorted(unknown)}; known: max_adapters, max_lora_rank, '
                             f'requests_per_minute')
        return cls(**d)


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
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    tenant_limits: dict[str, TenantLimits] = field(default_factory=dict)
    lora_alpha: float = 32.0

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
    def load_limits(path: str | None) -> tuple[TenantLimits, dict[str, TenantLimits]]:
        """A JSON file `{"default": {...}, "tenants": {"name": {...}}}`."""
        if not path:
            return TenantLimits(), {}
        raw = json.loads(Path(path).read_text())
        default = TenantLimits.from_dict(raw.get('default', {}))
        return default, {k: TenantLimits.from_dict(v) for k, v in raw.get('tenants', {}).items()}
