"""Server-side datasets for the native client: load, preprocess and encode on the server, against a hosted
model's template, and return the encoded rows.

    POST /twinkle/v1/datasets  {meta: {dataset_id_or_path, subset_name?, split?, data_slice?},
                                steps: [["set_template", name, {model_id?, ...}], ["map", name, {init_args?}],
                                        ["encode", {batched?, add_generation_prompt?}]]}  -> {rows: [...]}

Sources: ``ms://org/name`` / ``hf://org/name`` data sets (fetched by the hub clients, offline-capable; an id that
is not of that form or exists as a local path is refused, `twinkle_core.dataset.sources.hub_repo`), or a file or
directory inside a root the operator allowed (``--allow-path``; symlinks resolved, a directory with everything
below it) -- never another server path. Step arguments that name local paths obey the same roots (or a hosted
model's directory; `twinkle_server.api.native.paths`). Components are registered names (hub code named by a client
never runs). A template's ``model_id`` names a hosted base model (its public name, with or without
``ms://``/``hf://``); by default the first hosted model. The rows come back whole (bounded by
``max_dataset_rows``); the client batches them (`twinkle_client.dataloader.DataLoader`). A ``data_slice`` range
travels as ``{start, stop, step}`` and is bounds-checked from its ends before any row index is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from twinkle_core.dataset import Dataset, DatasetMeta
from twinkle_core.dataset.sources import hub_repo
from twinkle_core.errors import InvalidInputError
from twinkle_core.utils.json import to_json
from twinkle_server.api.deps import json_body, service, tenant
from twinkle_server.api.native.paths import first_outside, refuse_foreign_paths, refuse_hub_refs, roots_of
from twinkle_server.errors import ApiError, bad_request
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service

if TYPE_CHECKING:
    from twinkle_core.dataset import DatasetMeta

router = APIRouter(prefix='/twinkle/v1')
MAX_DATASET_ROWS = 100_000
STEPS = ('set_template', 'map', 'encode')
META_FIELDS = ('dataset_id_or_path', 'subset_name', 'split', 'data_slice')
OUTSIDE = (
    'a server-side dataset loads from ms:// / hf:// or from a root the operator allowed (--allow-path), not '
    'from another path on the server'
)


@router.post('/datasets')
async def build_dataset(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    meta, steps = body.get('meta'), body.get('steps') or []
    if not isinstance(meta, dict) or not isinstance(steps, list):
        raise bad_request('a dataset body is {"meta": {"dataset_id_or_path": ...}, "steps": [[op, ...], ...]}')
    rows = await run_in_threadpool(_build, svc, meta, steps)
    return {'rows': to_json(rows)}


def _build(svc: Service, meta: dict[str, Any], steps: list[Any]) -> list[dict[str, Any]]:
    source = _dataset_meta(svc, meta)
    plan = [_step(svc, step) for step in steps]  # every step checked before anything is loaded
    try:
        dataset = Dataset(source)
        for op, name, kwargs in plan:
            if op == 'set_template':
                dataset.set_template(name, **kwargs)
            elif op == 'map':
                dataset.map(name, init_args=kwargs.get('init_args') or {})
            else:
                dataset.encode(
                    batched=bool(kwargs.get('batched', True)),
                    add_generation_prompt=bool(kwargs.get('add_generation_prompt', False)),
                )
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bad source, name or argument is the client's to fix
        raise ApiError(422, f'dataset: {type(exc).__name__}: {exc}') from None
    if len(dataset) > MAX_DATASET_ROWS:
        raise ApiError(
            413,
            f'the dataset has {len(dataset)} rows; a server-side dataset returns at most '
            f'{MAX_DATASET_ROWS} (narrow it with data_slice)',
        )
    return [dict(dataset[i]) for i in range(len(dataset))]


def _step(svc: Service, step: Any) -> tuple[str, str | None, dict[str, Any]]:
    """(op, component name, keyword arguments) of one recorded step, validated."""
    op, *args = step if isinstance(step, list) and step else [None]
    if op not in STEPS:
        raise bad_request(f'unknown dataset step {op!r}; steps are {", ".join(STEPS)}')
    if op == 'encode':
        return op, None, args[0] if args and isinstance(args[0], dict) else {}
    name, kwargs = _named(args, op)
    model_id = kwargs.pop('model_id', None) if op == 'set_template' else None
    refuse_hub_refs(kwargs)
    refuse_foreign_paths(
        roots_of(*svc.config.allowed_roots, *(e.model_dir for e in svc.hosts.values())), OUTSIDE, kwargs
    )
    if op == 'set_template':
        kwargs['model_id'] = _model_dir(svc, model_id)
    return op, name, kwargs


def _dataset_meta(svc: Service, meta: dict[str, Any]) -> DatasetMeta:
    """The request's `DatasetMeta`, validated (400) and its source checked (`_check_source`)."""
    unknown = set(meta) - set(META_FIELDS)
    if unknown:
        raise bad_request(f'unknown dataset meta field(s) {sorted(unknown)}')
    fields = {**meta, 'data_slice': _data_slice(meta.get('data_slice'))}
    try:
        dataset_meta = DatasetMeta(fields.pop('dataset_id_or_path', None), **fields)
    except InvalidInputError as exc:
        raise bad_request(str(exc)) from None
    _check_source(svc, dataset_meta)
    return dataset_meta


def _data_slice(value: Any) -> Any:
    """A JSON ``data_slice``: ``{"start", "stop", "step"}`` -> a range (O(1): never a list of its indices); any
    other value as is (`DatasetMeta` validates it)."""
    if not isinstance(value, dict):
        return value
    unknown = set(value) - {'start', 'stop', 'step'}
    if unknown:
        raise bad_request(f'unknown data_slice field(s) {sorted(unknown)}; a range is {{"start", "stop", "step"}}')
    bounds = {'start': value.get('start', 0), 'stop': value.get('stop'), 'step': value.get('step', 1)}
    for key, bound in bounds.items():
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise bad_request(f'data_slice.{key} must be an integer, got {bound!r}')
    if bounds['step'] == 0:
        raise bad_request('data_slice.step must not be 0')
    return range(bounds['start'], bounds['stop'], bounds['step'])


def _named(args: list[Any], op: str) -> tuple[str, dict[str, Any]]:
    name = args[0] if args else None
    kwargs = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
    if not isinstance(name, str) or not name or '://' in name:
        raise ApiError(
            403 if isinstance(name, str) and '://' in name else 400,
            f'{op}: a registered component name is required, got {name!r}',
        )
    return name, dict(kwargs)


def _check_source(svc: Service, meta: DatasetMeta) -> None:
    """A hub id must reach only the hub (400 otherwise); a local source, with everything below a directory, must
    resolve inside an allowed root (403 otherwise)."""
    source = meta.dataset_id_or_path
    if meta.scheme in ('ms', 'hf'):
        try:
            hub_repo(source)
        except InvalidInputError as exc:
            raise bad_request(str(exc)) from None
    elif '://' in source:
        raise bad_request(
            f'{source!r}: a server-side dataset loads from ms://org/name, hf://org/name or a path '
            f'under a root the operator allowed (--allow-path)'
        )
    elif (outside := first_outside(source, roots_of(*svc.config.allowed_roots))) is not None:
        through = '' if outside == source else f' (it reaches {outside!r})'
        raise ApiError(403, f'{source!r}{through}: {OUTSIDE}')


def _model_dir(svc: Service, model_id: Any) -> str:
    """The local directory of the hosted base model `model_id` names (default: the first one)."""
    if model_id is None:
        return next(iter(svc.hosts.values())).model_dir
    name = svc.hosted_name(str(model_id))
    if name not in svc.hosts:
        raise ApiError(
            404,
            f'set_template: model_id {model_id!r} is not a base model served here; available: {sorted(svc.hosts)}',
        )
    return svc.hosts[name].model_dir
