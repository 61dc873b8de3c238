"""A session's history as a trace file, and the signed URLs that fetch it (`RestClient.export_session_trace`).

The file is JSON in the Chrome trace-event format, which https://ui.perfetto.dev opens (whatever the file is
named, `.pftrace` included). One track per training run and per sampling session of the session, plus one for the
session itself: each request (a future: `forward_backward`, `optim_step`, `sample`, `save_state`, ...) is a span
from submission to completion (a pending one ends at export time; a failed one carries its error), each
checkpoint an instant when it was written, each run and sampling session an instant when it was created. A
`twinkle` object beside `traceEvents` holds the same facts as plain JSON. Only what the store keeps is there:
finished requests are pruned a day after they finish, expired checkpoints are gone. Bounded: the newest
`MAX_REQUESTS` requests, `MAX_CHECKPOINTS` checkpoints, `MAX_MEMBERS` runs and sampling sessions;
`twinkle.truncated` says when some were left out.

URLs are signed like checkpoint downloads (HMAC-SHA256 over tenant, session and expiry, with a key derived from the
store's download secret, so every server on one database serves them) and fetched with a plain GET, no API key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any
from urllib.parse import quote, urlencode

from twinkle_server.errors import ApiError, not_found
from twinkle_server.store import CheckpointRow, RequestRow, Store
from twinkle_server.store.checkpoint_files import CheckpointPath

__all__ = ['MAX_REQUESTS', 'TRACE_PATH', 'build_trace', 'trace_url', 'verify']

MAX_REQUESTS = 10_000
MAX_CHECKPOINTS = 2_000
MAX_MEMBERS = 1_000  # training runs, and sampling sessions, of one session
MAX_ERROR_CHARS = 300
URL_LIFETIME_S = 3600
#: the route that serves signed trace downloads (`tinker/routes_sessions_extra.py`)
TRACE_PATH = '/api/v1/session_traces'
SESSION_TRACK = 0


def _key(store: Store) -> bytes:
    secret = bytes.fromhex(store.setting('download_url_secret', secrets.token_hex(32)))
    return hmac.new(secret, b'twinkle session trace', hashlib.sha256).digest()  # not a checkpoint URL's key


def _signature(store: Store, tenant: str, session_id: str, expires: int) -> str:
    message = '\n'.join((tenant, session_id, str(expires))).encode()
    return hmac.new(_key(store), message, hashlib.sha256).hexdigest()


def trace_url(store: Store, tenant: str, session_id: str, base_url: str) -> str:
    """A URL valid for `URL_LIFETIME_S` that downloads `tenant`'s session trace (built when fetched)."""
    expires = int(time.time()) + URL_LIFETIME_S
    query = {'owner': tenant, 'expires': expires, 'sig': _signature(store, tenant, session_id, expires)}
    return f'{base_url.rstrip("/")}{TRACE_PATH}/{quote(session_id, safe="")}?{urlencode(query)}'


def verify(store: Store, tenant: str, session_id: str, expires: int, sig: str) -> None:
    """403 for a bad or expired signature."""
    good = _signature(store, tenant, session_id, expires).encode()
    if not hmac.compare_digest(good, sig.encode('utf-8', 'replace')) or expires < time.time():
        raise ApiError(403, 'invalid or expired trace URL; call export_session_trace again', category='user')


def build_trace(store: Store, tenant: str, session_id: str) -> dict[str, Any]:
    """The trace of `tenant`'s session (module docstring); 404 for anyone else's."""
    session = store.session(session_id, tenant)
    if session is None:
        raise not_found('session', session_id)
    run_ids, sampler_ids = store.session_members(session_id, tenant)
    runs = [r for r in (store.training_run(i, tenant) for i in run_ids[:MAX_MEMBERS]) if r is not None]
    samplers = [s for s in (store.sampling_session(i, tenant) for i in sampler_ids[:MAX_MEMBERS]) if s is not None]
    checkpoints = sorted(
        (c for r in runs for hidden in (False, True) for c in store.checkpoints(tenant, r.run_id, hidden=hidden)),
        key=lambda c: c.created_at,
        reverse=True,
    )
    requests, total_requests = store.session_requests(session_id, tenant, MAX_REQUESTS)

    tracks = {r.run_id: i for i, r in enumerate(runs, 1)}
    tracks.update({s.sampling_session_id: i for i, s in enumerate(samplers, len(runs) + 1)})
    events: list[dict[str, Any]] = [_meta('process_name', SESSION_TRACK, f'session {session_id}')]
    events += [_meta('thread_name', t, name) for name, t in [('session', SESSION_TRACK), *tracks.items()]]
    events.append(
        _instant(
            'create session',
            session.created_at,
            SESSION_TRACK,
            {'project_id': session.project_id, 'display_name': session.display_name, 'tags': session.tags},
        )
    )
    for r in runs:
        args = {'base_model': r.base_model, 'lora_config': r.lora_config, 'user_metadata': r.user_metadata}
        events.append(_instant('create training run', r.created_at, tracks[r.run_id], args))
    for s in samplers:
        args = {'base_model': s.base_model, 'model_path': s.model_path}
        events.append(_instant('create sampling session', s.created_at, tracks[s.sampling_session_id], args))
    for c in checkpoints[:MAX_CHECKPOINTS]:
        events.append(_instant(f'checkpoint {c.checkpoint_id}', c.created_at, tracks[c.run_id], _checkpoint(c)))
    now = time.time()
    events += [_span(q, tracks, now) for q in reversed(requests)]

    return {
        'traceEvents': events,
        'displayTimeUnit': 'ms',
        'twinkle': {
            'session': {
                'session_id': session.session_id,
                'created_at': session.created_at,
                'last_seen': session.last_seen,
                'finished': session.finished,
                'finish_reason': session.finish_reason,
                'project_id': session.project_id,
                'display_name': session.display_name,
                'tags': session.tags,
                'user_metadata': session.user_metadata,
            },
            'training_runs': [{'run_id': r.run_id, 'base_model': r.base_model} for r in runs],
            'sampling_sessions': [
                {'sampling_session_id': s.sampling_session_id, 'base_model': s.base_model, 'model_path': s.model_path}
                for s in samplers
            ],
            'checkpoints': [_checkpoint(c) for c in checkpoints[:MAX_CHECKPOINTS]],
            'requests': {'total': total_requests, 'included': len(requests)},
            'truncated': (
                total_requests > len(requests)
                or len(checkpoints) > MAX_CHECKPOINTS
                or max(len(run_ids), len(sampler_ids)) > MAX_MEMBERS
            ),
        },
    }


def _us(t: float) -> int:
    return int(t * 1_000_000)


def _meta(name: str, track: int, value: str) -> dict[str, Any]:
    return {'ph': 'M', 'name': name, 'pid': 1, 'tid': track, 'args': {'name': value}}


def _instant(name: str, t: float, track: int, args: dict[str, Any]) -> dict[str, Any]:
    return {'ph': 'i', 's': 't', 'name': name, 'ts': _us(t), 'pid': 1, 'tid': track, 'args': args}


def _checkpoint(c: CheckpointRow) -> dict[str, Any]:
    segment, name = c.checkpoint_id.split('/', 1)
    return {
        'tinker_path': CheckpointPath(c.run_id, segment, name).uri(),
        'kind': c.kind,
        'created_at': c.created_at,
        'size_bytes': c.size_bytes,
        'expires_at': c.expires_at,
        'public': c.public,
        'listed': c.listed,
    }


def _span(q: RequestRow, tracks: dict[str, int], now: float) -> dict[str, Any]:
    """A request as a complete event on its model's or sampling session's track (else the session's)."""
    sampler = q.target.rsplit('#', 1)[0] if q.target else None
    track = tracks.get(q.model_id or '', tracks.get(sampler or '', SESSION_TRACK))
    end = q.finished_at if q.finished_at is not None else now
    args: dict[str, Any] = {'request_id': q.request_id, 'state': q.state, 'model_id': q.model_id}
    if q.target:
        args['sampling_client'] = q.target
    if q.error is not None:
        args['error'] = _error(q.error)
    return {
        'ph': 'X',
        'name': q.op or 'request',
        'ts': _us(q.created_at),
        'dur': max(0, _us(end) - _us(q.created_at)),
        'pid': 1,
        'tid': track,
        'args': args,
    }


def _error(body: bytes) -> str:
    try:
        message = json.loads(body).get('error')
    except (ValueError, AttributeError):
        message = None
    return (message if isinstance(message, str) else body.decode('utf-8', 'replace'))[:MAX_ERROR_CHARS]
