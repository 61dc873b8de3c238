"""Rollout sessions on `/v1`: record what unmodified agent code samples, as tokens, and hand it back as training
episodes (`rollout_episodes`).

A session belongs to the tenant that opened it (another tenant's id reads as not found), samples one policy named
at creation (a base model or a saved sampler checkpoint: immutable, so every call of the session is pinned to the
same weights; a call naming another model is refused), and is capped: calls, tokens (prompt + sampled, over all
calls) and lifetime (``ttl_s``; an expired session is refused, then deleted by the reaper). Sessions and their
calls are rows of the metadata store, written as each call completes: a restart (or a killed server) keeps every
finished call. `RolloutOperations` is a collaborator `Service` holds (as `rollouts`).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from twinkle_server.errors import ApiError, bad_request, not_found
from twinkle_server.service.rollout_episodes import Node, call_record, episodes, nodes_of
from twinkle_server.store import RolloutRow, Store

__all__ = ['ROLLOUT_DEFAULTS', 'ROLLOUT_MAXIMA', 'MAX_LIVE_ROLLOUTS', 'RolloutOperations']

#: a session's caps when it names none, and the most it may ask for
ROLLOUT_DEFAULTS = {'ttl_s': 3600.0, 'max_calls': 256, 'max_tokens': 1_000_000}
ROLLOUT_MAXIMA = {'ttl_s': 7 * 24 * 3600.0, 'max_calls': 100_000, 'max_tokens': 100_000_000}
#: live (unexpired) rollout sessions per tenant
MAX_LIVE_ROLLOUTS = 4096


class RolloutOperations:
    """Open, read, reward and delete rollout sessions; record their calls; reap the expired ones."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()  # call numbers: one record per (session, call), in order

    def create(self, tenant: str, model: str, **caps: Any) -> RolloutRow:
        """A new session of `tenant` sampling `model` (already resolved by the caller), with `caps` (``ttl_s``,
        ``max_calls``, ``max_tokens``; defaults `ROLLOUT_DEFAULTS`, at most `ROLLOUT_MAXIMA`)."""
        unknown = sorted(set(caps) - set(ROLLOUT_DEFAULTS))
        if unknown:
            raise bad_request(f'unknown rollout session fields {unknown}; known: {sorted(ROLLOUT_DEFAULTS)}')
        limits: dict[str, Any] = {k: v if caps.get(k) is None else caps[k] for k, v in ROLLOUT_DEFAULTS.items()}
        for name, value in limits.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= ROLLOUT_MAXIMA[name]:
                raise bad_request(f'{name} must be a number in (0, {ROLLOUT_MAXIMA[name]:g}], got {value!r}')
        now = time.time()
        if self.store.count_live_rollouts(tenant, now) >= MAX_LIVE_ROLLOUTS:
            raise ApiError(429, f'at most {MAX_LIVE_ROLLOUTS} live rollout sessions per tenant; delete finished ones')
        ttl = float(limits.pop('ttl_s'))
        row = RolloutRow(f'rollout_{uuid.uuid4().hex}', tenant, model, now, now + ttl, limits, None)
        self.store.add_rollout(row)
        return row

    def get(self, tenant: str, session_id: str) -> RolloutRow:
        """The live session (404 for an unknown, another tenant's or an expired one)."""
        row = self.store.rollout(session_id, tenant)
        if row is None or row.expires_at <= time.time():
            raise not_found('rollout session', session_id)
        return row

    def nodes(self, row: RolloutRow) -> list[Node]:
        return nodes_of(self.store.rollout_calls(row.session_id))

    def check_call(self, row: RolloutRow, nodes: list[Node], model: str | None) -> None:
        """Refuse a call over the session's caps or naming another policy than the session's."""
        if model is not None and model != row.model:
            raise bad_request(
                f'this rollout session samples {row.model!r} (pinned when it was opened); a call naming {model!r} '
                'is refused: open another session for another policy'
            )
        calls = len({n.call for n in nodes})
        if calls >= row.limits['max_calls']:
            raise ApiError(429, f'the rollout session has made its max_calls={row.limits["max_calls"]} calls')
        used = sum(len(n.prompt_ids) + len(n.tokens) for n in nodes)
        if used >= row.limits['max_tokens']:
            raise ApiError(429, f'the rollout session has used its max_tokens={row.limits["max_tokens"]} tokens')

    def record(
        self, row: RolloutRow, prompt_text: str, prompt_ids: list[int], parent: Node | None, choices: list[dict]
    ) -> int:
        """Store one finished call; returns its number in the session."""
        with self._lock:
            call = self.store.count_rollout_calls(row.session_id)
            self.store.add_rollout_call(
                row.session_id, call, call_record(call, prompt_text, prompt_ids, parent, choices)
            )
        return call

    def episodes(self, tenant: str, session_id: str) -> dict[str, Any]:
        """The session's episodes as training rows, with their rewards once posted, and its splits."""
        row = self.get(tenant, session_id)
        rows, splits = episodes(self.nodes(row))
        rewards = _rewards_for(row.rewards, len(rows))
        for episode, reward in zip(rows, rewards):
            episode['reward'] = reward
        return {'object': 'list', 'data': rows, 'splits': splits, 'calls': len({c for r in rows for c in r['calls']})}

    def reward(self, tenant: str, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Set the session's reward: ``{"reward": x}`` (every episode) or ``{"rewards": [...]}`` (one per episode, in
        the order `episodes` lists them)."""
        row = self.get(tenant, session_id)
        count = len(episodes(self.nodes(row))[0])
        if set(body) == {'reward'} and _number(body['reward']):
            rewards: dict[str, Any] = {'reward': float(body['reward'])}
        elif set(body) == {'rewards'} and isinstance(body['rewards'], list) and all(map(_number, body['rewards'])):
            if len(body['rewards']) != count:
                raise bad_request(f'rewards has {len(body["rewards"])} numbers; the session has {count} episodes')
            rewards = {'rewards': [float(x) for x in body['rewards']]}
        else:
            raise bad_request('the body must be {"reward": number} or {"rewards": [number per episode]}')
        self.store.set_rollout_rewards(session_id, rewards)
        return {**rewards, 'episodes': count}

    def delete(self, tenant: str, session_id: str) -> None:
        self.get(tenant, session_id)
        self.store.delete_rollout(session_id)

    def reap(self) -> int:
        """Delete the expired sessions and their calls; returns how many."""
        expired = self.store.expired_rollouts(time.time())
        for session_id in expired:
            self.store.delete_rollout(session_id)
        return len(expired)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float('inf')


def _rewards_for(rewards: dict[str, Any] | None, count: int) -> list[float | None]:
    if rewards is None:
        return [None] * count
    if 'reward' in rewards:
        return [rewards['reward']] * count
    per = rewards['rewards']
    if len(per) != count:
        raise ApiError(409, f'rewards were posted for {len(per)} episodes; the session has {count} now: post again')
    return list(per)
