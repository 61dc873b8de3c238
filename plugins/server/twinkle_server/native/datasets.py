"""Server-side datasets for the native client: load, preprocess and encode on the server, against a hosted
model's template, and return the encoded rows.

    POST /twinkle/v1/datasets  {meta: {dataset_id_or_path, subset_name?, split?, data_slice?},
                                steps: [["set_template", name, {model_id?, ...}], ["map", name, {init_args?}],
                                        ["encode", {batched?, add_generation_prompt?}]]}  -> {rows: [...]}

Sources: ``ms://`` / ``hf://`` data sets (fetched by the hub clients, offline-capable), or a file inside a root
the operator allowed (``--allow-path``) -- never another server path. Components are registered names (hub code
named by a client never runs). A template's ``model_id`` names a hosted base model (its public name, with or
without ``ms://``/``hf://``); by default the first hosted model. The rows come back whole (bounded by
``max_dataset_rows``); the client batches them (`twinkle_client.dataloader.DataLoader`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from twinkle_core.utils.json import to_json
from twinkle_server.auth import Tenant
from twinkle_server.deps import json_body, service, tenant
from twinkle_server.errors import ApiError, bad_request
from twinkle_server.service import Service

router = APIRouter(prefix='/twinkle/v1')
MAX_DATASET_ROWS = 100_000
STEPS = ('set_template', 'map', 'encode')


@router.post('/datasets')
async def build_dataset(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    meta, steps = body.get('meta'), body.get('steps') or []
    if not isinstance(meta, dict) or not isinstance(steps, list):
        raise bad_request('a dataset body is {"meta": {"dataset_id_or_path": ...}, "steps": [[op, ...], ...]}')
    rows = await run_in_threadpool(_build, svc, meta, steps)
    return {'rows': to_json(rows)}


def _build(svc: Service, meta: dict[str, Any], steps: list[Any]) -> list[dict[str, Any]]:
    from twinkle_core.dataset import Dataset, DatasetMeta
    _check_source(svc, str(meta.get('dataset_id_or_path', '')))
    plan = [_step(svc, step) for step in steps]  # every step checked before anything is loaded
    try:
        dataset = Dataset(DatasetMeta(**_meta_fields(meta)))
        for op, name, kwargs in plan:
            if op == 'set_template':
                dataset.set_template(name, **kwargs)
            elif op == 'map':
                dataset.map(name, init_args=kwargs.get('init_args') or {})
            else:
                dataset.encode(batched=bool(kwargs.get('batched', True)),
                               add_generation_prompt=bool(kwargs.get('add_generation_prompt', False)))
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bad source, name or argument is the client's to fix
        raise ApiError(422, f'dataset: {type(exc).__name__}: {exc}') from None
    if len(dataset) > MAX_DATASET_ROWS:
        raise ApiError(413, f'the dataset has {len(dataset)} rows; a server-side dataset returns at most '
                            f'{MAX_DATASET_ROWS} (narrow it with data_slice)')
    return [dict(dataset[i]) for i in range(len(dataset))]


def _step(svc: Service, step: Any) -> tuple[str, str | None, dict[str, Any]]:
    """(op, component name, keyword arguments) of one recorded step, validated."""
    op, *args = step if isinstance(step, list) and step else [None]
    if op not in STEPS:
        raise bad_request(f'unknown dataset step {op!r}; steps are {", ".join(STEPS)}')
    if op == 'encode':
        return op, None, args[0] if args and isinstance(args[0], dict) else {}
    name, kwargs = _named(args, op)
    if op == 'set_template':
        kwargs['model_id'] = _model_dir(svc, kwargs.get('model_id'))
    return op, name, kwargs


def _meta_fields(meta: dict[str, Any]) -> dict[str, Any]:
    unknown = set(meta) - {'dataset_id_or_path', 'subset_name', 'split', 'data_slice'}
    if unknown:
        raise bad_request(f'unknown dataset meta field(s) {sorted(unknown)}')
    fields = dict(meta)
    if isinstance(fields.get('data_slice'), dict):  # {"start", "stop", "step"}: a range
        r = fields['data_slice']
        fields['data_slice'] = range(int(r.get('start', 0)), int(r['stop']), int(r.get('step', 1)))
    return fields


def _named(args: list[Any], op: str) -> tuple[str, dict[str, Any]]:
    name = args[0] if args else None
    kwargs = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
    if not isinstance(name, str) or not name or '://' in name:
        raise ApiError(403 if isinstance(name, str) and '://' in name else 400,
                       f'{op}: a registered component name is required, got {name!r}')
    return name, dict(kwargs)


def _check_source(svc: Service, source: str) -> None:
    if source.startswith(('ms://', 'hf://')):
        return
    where = Path(source).expanduser().resolve()
    roots = [Path(r).resolve() for r in svc.config.allowed_roots]
    if not any(where == r or where.is_relative_to(r) for r in roots):
        raise ApiError(403, f'{source!r}: a server-side dataset loads from ms:// / hf:// or from a root the operator '
                            f'allowed (--allow-path), not from another path on the server')


def _model_dir(svc: Service, model_id: Any) -> str:
    """The local directory of the hosted base model `model_id` names (default: the first one)."""
    if model_id is None:
        return next(iter(svc.engines.values())).model_dir
    name = svc.hosted_name(str(model_id))
    if name not in svc.engines:
        raise ApiError(404, f'set_template: model_id {model_id!r} is not a base model served here; available: '
                            f'{sorted(svc.engines)}')
    return svc.engines[name].model_dir
