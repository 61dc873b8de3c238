"""The console's operator view (admin keys only): every base model with its queue depth per kind of work,
running work and live adapters; live adapters per tenant; recent failed requests with their request ids; and the
`/metrics` families (`metrics.snapshot`) as rows. Token throughput is the `twinkle_tokens_total` counter, which
the page turns into tokens/s between two polls."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from twinkle_server.metrics import snapshot
from twinkle_server.service.core import Service

__all__ = ['operator_snapshot']

MAX_ERRORS = 50
MAX_ERROR_CHARS = 300
QUEUE_KINDS = ('train', 'sample', 'call')
SHOWN_TYPES = ('gauge', 'counter')  # histogram buckets stay on /metrics


def _error_text(body: bytes | None) -> str:
    try:
        text = str(json.loads(body or b'{}').get('error', ''))
    except (ValueError, AttributeError):
        text = (body or b'').decode('utf-8', 'replace')
    return text[:MAX_ERROR_CHARS]


def operator_snapshot(svc: Service) -> dict[str, Any]:
    """The operator page's data (module docstring), read from this server's service and the shared store."""
    gauges = svc.metrics.gauges
    depths = gauges.queue_depths() if gauges else {}
    running = gauges.running() if gauges else {}
    adapters = svc.live_adapters()
    models = [
        {
            'id': name,
            'name': name,
            **{f'queue_{kind}': depths.get(name, {}).get(kind, 0) for kind in QUEUE_KINDS},
            'running': running.get(name, 0),
            'adapters': adapters.get(name, 0),
        }
        for name in sorted(svc.hosts)
    ]
    per_tenant = Counter((m.tenant, m.base_model) for m in svc.models)
    live = [
        {'id': f'{tenant} {model}', 'tenant': tenant, 'model': model, 'adapters': n}
        for (tenant, model), n in sorted(per_tenant.items())
    ]
    errors = [
        {
            'id': rid,
            'request_id': rid,
            'tenant': tenant,
            'op': op,
            'model': model,
            'finished': at,
            'error': _error_text(body),
        }
        for rid, tenant, op, model, at, body in svc.store.recent_failures(MAX_ERRORS)
    ]
    rows, tokens = [], 0.0
    for family in snapshot(svc.metrics):
        if family.type not in SHOWN_TYPES:
            continue
        for suffix, labels, value in family.samples:
            if family.name == 'twinkle_tokens_total':
                tokens += value
            label_text = ', '.join(f'{k}={v}' for k, v in labels.items())
            rows.append(
                {
                    'id': f'{family.name}{suffix}{{{label_text}}}',
                    'metric': family.name + suffix,
                    'labels': label_text,
                    'value': value,
                }
            )
    return {
        'time': time.time(),
        'tenants': sorted(svc.store.tenants()),
        'models': models,
        'adapters': live,
        'errors': errors,
        'gauges': rows,
        'tokens_total': tokens,
    }
