"""What the console shows a tenant, as JSON-ready rows: its training runs, one run's checkpoints, sampler
checkpoints and pending requests, its per-step metric series, the checkpoints the playground can sample.

Everything is read through the store's tenant-scoped methods (another tenant's run is 404, as in the API), so it
is the same on SQLite and PostgreSQL and on every server of a deployment. Live state (which models are loaded)
comes from the service this server runs."""

from __future__ import annotations

import bisect
from typing import Any
from urllib.parse import quote

from twinkle_server.api.console.session import BASE
from twinkle_server.errors import not_found
from twinkle_server.service.core import Service
from twinkle_server.store import CheckpointRow, TrainingRunRow
from twinkle_server.store.checkpoint_files import CheckpointPath

__all__ = ['checkpoint_choices', 'metric_series', 'owned_run', 'run_detail', 'run_facts', 'run_rows', 'run_url']

MAX_RUNS = 200
MAX_PENDING = 200


def _rank(run: TrainingRunRow) -> Any:
    return (run.lora_config.get('lora') or {}).get('rank')


def _name(run: TrainingRunRow) -> str:
    """The run's name: its `name` metadata (as the client set it, shown as text), else its id."""
    return str((run.user_metadata or {}).get('name') or run.run_id)


def _status(svc: Service, run: TrainingRunRow) -> str:
    if run.corrupted:
        return 'corrupted'
    if run.run_id in svc.models:
        return 'training'
    return 'idle (model unloaded)'


def run_url(run_id: str) -> str:
    return f'{BASE}/runs/{quote(run_id, safe="")}'


def run_rows(svc: Service, tenant: str) -> list[dict[str, Any]]:
    """`tenant`'s newest training runs: id, name, base model, LoRA rank, created, last step, status."""
    runs, _ = svc.store.training_runs(tenant, MAX_RUNS, 0)
    last = svc.store.last_steps(tenant)
    return [
        {
            'id': r.run_id,
            'name': _name(r),
            'url': run_url(r.run_id),
            'base_model': r.base_model,
            'lora_rank': _rank(r),
            'created': r.created_at,
            'last_step': last.get(r.run_id),
            'status': _status(svc, r),
        }
        for r in runs
    ]


def owned_run(svc: Service, tenant: str, run_id: str) -> TrainingRunRow:
    run = svc.store.training_run(run_id, tenant)
    if run is None:
        raise not_found('training run', run_id)
    return run


def metric_series(svc: Service, tenant: str, run_id: str) -> dict[str, list[list[float]]]:
    """Metric name -> [steps, values] of `tenant`'s run (404 for anyone else's)."""
    owned_run(svc, tenant, run_id)
    series: dict[str, list[list[float]]] = {}
    for _op, step, _at, metrics in svc.store.run_metrics(run_id, tenant):
        for name, value in metrics.items():
            xs, ys = series.setdefault(name, [[], []])
            xs.append(step)
            ys.append(value)
    return series


def run_detail(svc: Service, tenant: str, run_id: str) -> dict[str, Any]:
    """The run page's data: the run's facts, its checkpoints (training and external; with the step each was saved
    at, its size and hub push), its sampler checkpoints and its pending requests."""
    run = owned_run(svc, tenant, run_id)
    rows = run_facts(svc, run)
    steps = [(at, step) for op, step, at, _ in svc.store.run_metrics(run_id, tenant) if op == 'forward_backward']
    times = [at for at, _ in steps]
    pushes = svc.store.pushes(tenant, run_id)

    def checkpoint(c: CheckpointRow) -> dict[str, Any]:
        segment, name = c.checkpoint_id.split('/', 1)
        i = bisect.bisect_right(times, c.created_at)
        push = pushes.get((c.run_id, c.checkpoint_id))
        ident = quote(c.checkpoint_id, safe='/')
        return {
            'id': c.checkpoint_id,
            'name': name,
            'kind': c.kind,
            'path': CheckpointPath(c.run_id, segment, name).uri(),
            'step': steps[i - 1][1] if i else None,
            'size': c.size_bytes,
            'created': c.created_at,
            'push': f'{push.state} → {push.repo}' if push else 'not pushed',
            'download_url': f'{run_url(run_id)}/checkpoints/{ident}/download',
            'delete_url': f'{BASE}/api/runs/{quote(run_id, safe="")}/checkpoints/{ident}/delete',
        }

    listed = [checkpoint(c) for c in svc.store.checkpoints(tenant, run_id)]
    pending = [
        {'id': rid, 'request_id': rid, 'op': op, 'created': at}
        for rid, op, model_id, at in svc.store.pending_requests(tenant, MAX_PENDING)
        if model_id == run_id
    ]
    return {
        'run': rows,
        'checkpoints': [c for c in listed if c['kind'] != 'sampler'],
        'samplers': [c for c in listed if c['kind'] == 'sampler'],
        'futures': pending,
    }


def run_facts(svc: Service, run: TrainingRunRow) -> dict[str, Any]:
    return {
        'id': run.run_id,
        'name': _name(run),
        'base_model': run.base_model,
        'lora_rank': _rank(run),
        'created': run.created_at,
        'last_step': svc.store.last_steps(run.tenant).get(run.run_id),
        'status': _status(svc, run),
        'session': run.session_id,
    }


def checkpoint_choices(svc: Service, tenant: str) -> list[dict[str, str]]:
    """What the playground can sample from: `tenant`'s sampler and training checkpoints, newest first, then every
    base model this server hosts."""
    out = []
    for c in sorted(svc.store.checkpoints(tenant), key=lambda c: -c.created_at):
        if c.kind in ('sampler', 'training'):
            segment, name = c.checkpoint_id.split('/', 1)
            path = CheckpointPath(c.run_id, segment, name).uri()
            out.append({'path': path, 'label': path})
    return out + [{'path': name, 'label': f'{name} (base model)'} for name in sorted(svc.hosts)]
