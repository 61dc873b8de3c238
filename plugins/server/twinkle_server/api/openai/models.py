"""What the `model` field names, and what `/v1/models` lists.

A `model` is one of:

- a hosted base model, by its served name (an ``hf://`` / ``ms://`` prefix is accepted, as on the Tinker routes);
- a checkpoint the caller owns, by its path: ``tinker://<run_id>/sampler_weights/<name>`` as
  `save_weights_for_sampler` returns it (a ``weights/`` path of `save_state` works too; ``twinkle://`` likewise);
- the alias ``<base model>:<checkpoint name>``: the caller's most recently saved sampler checkpoint of that name on
  that base model.

Anything else, another tenant's checkpoint included, is 404 ``model_not_found``: another tenant's ids are never
told apart from ids that do not exist.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from twinkle_server.api.openai.errors import model_not_found
from twinkle_server.api.openai.schemas import ModelCard
from twinkle_server.errors import ApiError
from twinkle_server.service.core import Service
from twinkle_server.store import CheckpointRow
from twinkle_server.store.checkpoint_files import parse_path

SAMPLER_PREFIX = 'sampler_weights/'
STARTED = int(time.time())  # the `created` time of the base models: when this server process started


@dataclass(frozen=True)
class Target:
    """What a request samples from: `base_model` (a hosted name) and, for a checkpoint, its `model_path`."""

    base_model: str
    model_path: str | None = None


def resolve(svc: Service, tenant: str, model: str) -> Target:
    """The target `model` names for `tenant` (module docstring); 404 ``model_not_found`` for anything else."""
    base = svc.hosted_name(model)
    if base in svc.hosts:
        return Target(base)
    if model.startswith(('tinker://', 'twinkle://')):
        try:
            _, row = svc.checkpoints.checkpoint(tenant, model)
            base = svc.files.read_meta(row.directory)['base_model']
        except (ApiError, OSError, KeyError, ValueError):
            raise model_not_found(model) from None
        if base not in svc.hosts:
            raise model_not_found(model)
        return Target(base, model)
    for name in sorted(svc.hosts, key=len, reverse=True):  # the longest base name first: names may hold ':'
        if model.startswith(f'{name}:') and len(model) > len(name) + 1:
            path = _alias_path(svc, tenant, name, model[len(name) + 1 :])
            if path is not None:
                return Target(name, path)
    raise model_not_found(model)


def _alias_path(svc: Service, tenant: str, base: str, name: str) -> str | None:
    """The tinker path of `tenant`'s newest sampler checkpoint called `name` on `base`, if any."""
    for row in svc.store.checkpoints(tenant):  # newest first
        if row.checkpoint_id == f'{SAMPLER_PREFIX}{name}' and _base_of(svc, tenant, row) == base:
            return _uri(row)
    return None


def cards(svc: Service, tenant: str) -> list[ModelCard]:
    """The hosted base models, then `tenant`'s listed sampler checkpoints (newest first)."""
    out = [
        ModelCard(id=name, created=STARTED, owned_by='twinkle', root=name, max_model_len=host.max_context_length)
        for name, host in sorted(svc.hosts.items())
    ]
    for row in svc.store.checkpoints(tenant):
        if not row.checkpoint_id.startswith(SAMPLER_PREFIX):
            continue
        base = _base_of(svc, tenant, row)
        if base is None or base not in svc.hosts:
            continue
        out.append(
            ModelCard(
                id=_uri(row),
                created=int(row.created_at),
                owned_by=tenant,
                root=base,
                parent=base,
                alias=f'{base}:{row.checkpoint_id[len(SAMPLER_PREFIX) :]}',
                max_model_len=svc.hosts[base].max_context_length,
            )
        )
    return out


def card(svc: Service, tenant: str, model: str) -> ModelCard:
    """The `/v1/models` entry of what `model` names (an alias answers its checkpoint's entry)."""
    target = resolve(svc, tenant, model)
    host = svc.hosts[target.base_model]
    if target.model_path is None:
        name = target.base_model
        return ModelCard(id=name, created=STARTED, owned_by='twinkle', root=name, max_model_len=host.max_context_length)
    cp = parse_path(target.model_path)
    row = svc.store.checkpoint(cp.run_id, cp.checkpoint_id, tenant)
    created = int(row.created_at) if row is not None else STARTED
    alias = f'{target.base_model}:{cp.name}' if cp.segment == 'sampler_weights' else None
    return ModelCard(
        id=target.model_path,
        created=created,
        owned_by=tenant,
        root=target.base_model,
        parent=target.base_model,
        alias=alias,
        max_model_len=host.max_context_length,
    )


def _base_of(svc: Service, tenant: str, row: CheckpointRow) -> str | None:
    run = svc.store.training_run(row.run_id, tenant)
    if run is not None:
        return run.base_model
    try:
        return svc.files.read_meta(row.directory)['base_model']
    except (OSError, KeyError, ValueError):
        return None


def _uri(row: CheckpointRow) -> str:
    return f'tinker://{row.run_id}/{row.checkpoint_id}'
