"""Custom losses disabled for running past their time budget, and the tenants throttled for it.

The model host's `GraphLoss` times every evaluation (`custom_loss_cost.Budget`); one that runs past
`custom_loss_time_s` is stopped at its next node, its graph (tenant + digest: the same graph uploaded again stays
disabled) is disabled here, and its tenant is throttled: for `PENALTY_S` seconds, doubling with each further
offence up to `MAX_PENALTY_S`, the tenant's `create_custom_loss` and custom-loss `forward_backward` requests are
answered 429 with Retry-After. Later uses of a disabled loss are a 422 naming it.

`GUARD` is one per process: in an embedded server the model host and the routes share it, so the routes refuse at
the POST. In a Ray deployment the host runs in another process: there the host refuses a disabled loss (its step
fails as the client's error) and the tenant is not throttled at the routes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

PENALTY_S = 60.0
MAX_PENALTY_S = 3600.0
MAX_ENTRIES = 10_000  # bound memory: the oldest records go first


class CustomLossGuard:
    """Thread-safe, bounded record of disabled graphs and throttled tenants."""

    def __init__(self) -> None:
        self._disabled: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._penalties: OrderedDict[str, tuple[float, int]] = OrderedDict()  # tenant -> (until, offences)
        self._lock = threading.Lock()

    def disable(self, tenant: str, digest: str, reason: str) -> None:
        """Disable graph `digest` of `tenant` for `reason`, and throttle the tenant (module docstring)."""
        with self._lock:
            self._disabled[(tenant, digest)] = reason
            self._disabled.move_to_end((tenant, digest))
            _, offences = self._penalties.pop(tenant, (0.0, 0))
            self._penalties[tenant] = (time.monotonic() + min(MAX_PENALTY_S, PENALTY_S * 2**offences), offences + 1)
            for table in (self._disabled, self._penalties):
                while len(table) > MAX_ENTRIES:
                    table.popitem(last=False)

    def disabled(self, tenant: str, digest: str) -> str | None:
        """Why graph `digest` of `tenant` is disabled, or None."""
        with self._lock:
            return self._disabled.get((tenant, digest))

    def penalty_left(self, tenant: str) -> float:
        """Seconds `tenant` stays throttled (0: not throttled)."""
        with self._lock:
            until, _ = self._penalties.get(tenant, (0.0, 0))
        return max(0.0, until - time.monotonic())


#: the process's guard (module docstring)
GUARD = CustomLossGuard()
