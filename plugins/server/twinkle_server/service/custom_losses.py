"""The custom losses tenants uploaded (`/create_custom_loss`), by id, bound to the tenant and session that created
them; the engine runs them by their spec (`engine/custom_loss/`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from twinkle_server.engine.custom_loss.ops import GraphError
from twinkle_server.engine.custom_loss.program import MAX_LOSSES_PER_TENANT, CustomLossSpec


@dataclass(frozen=True)
class StoredLoss:
    loss_id: str
    tenant: str
    session_id: str
    spec: CustomLossSpec


class CustomLossStore:
    """Custom losses by id, bound to the tenant and session that created them; in memory (a restart forgets them),
    at most `MAX_LOSSES_PER_TENANT` per tenant (least recently used first out). Thread-safe."""

    def __init__(self, max_per_tenant: int = MAX_LOSSES_PER_TENANT) -> None:
        self.max_per_tenant = max_per_tenant
        self._losses: OrderedDict[str, StoredLoss] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def add(self, tenant: str, session_id: str, seq_id: int, spec: CustomLossSpec) -> str:
        """Store `spec` as loss `seq_id` of the session; the same request again gets the same id, another loss
        under a used `seq_id` raises `GraphError`."""
        loss_id = f'{session_id}:loss:{seq_id}'
        with self._lock:
            old = self._losses.get(loss_id)
            if old is not None:
                if old.tenant != tenant or old.spec.digest != spec.digest:
                    raise GraphError(f'custom_loss_seq_id {seq_id} of this session already names another loss')
                self._losses.move_to_end(loss_id)
                return loss_id
            self._losses[loss_id] = StoredLoss(loss_id, tenant, session_id, spec)
            mine = [k for k, v in self._losses.items() if v.tenant == tenant]
            for key in mine[: max(0, len(mine) - self.max_per_tenant)]:
                del self._losses[key]
        return loss_id

    def get(self, tenant: str, session_id: str, loss_id: str) -> StoredLoss | None:
        """The loss `loss_id` if `tenant`'s session `session_id` created it."""
        with self._lock:
            stored = self._losses.get(loss_id)
            if stored is None or stored.tenant != tenant or stored.session_id != session_id:
                return None
            self._losses.move_to_end(loss_id)
            return stored

    def drop_session(self, session_id: str) -> None:
        with self._lock:
            for key in [k for k, v in self._losses.items() if v.session_id == session_id]:
                del self._losses[key]
