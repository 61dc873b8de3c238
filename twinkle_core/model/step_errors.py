"""Per-tenant failures of a mixed multi-tenant step (any backend that trains several adapters in one pass).

A tenant whose rows are invalid, whose loss raises or is not finite, or whose gradients are not finite has its
micro-batch rejected: nothing of it reaches its adapter, and no other tenant is affected. The failure is reported
as a `TenantStepError` for that tenant only; a mixed call collects them in a `MixedStepError`, which also carries
the results of the tenants that succeeded (their gradients *were* accumulated).
"""

from __future__ import annotations

from typing import Any, Literal

from twinkle_core.errors import TwinkleError

Stage = Literal['input', 'forward', 'loss', 'backward', 'gradient']


class TenantStepError(TwinkleError):
    """One tenant's micro-batch was rejected. `stage` says where: 'input' (rows failed validation or
    collation), 'forward', 'loss' (raised or not finite), 'backward' or 'gradient' (non-finite gradients)."""

    def __init__(self, adapter_name: str, stage: Stage, message: str) -> None:
        super().__init__(f'adapter {adapter_name!r}: {stage} rejected: {message}')
        self.adapter_name, self.stage, self.detail = adapter_name, stage, message

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, for a server to return to this tenant only."""
        return {
            'adapter_name': self.adapter_name,
            'stage': self.stage,
            'message': self.detail,
            'type': type(self).__name__,
        }


class MixedStepError(TwinkleError):
    """Some tenants of a mixed step failed. `errors`: adapter name -> `TenantStepError`; `results`: adapter
    name -> result of every tenant that succeeded (its step was applied as if called alone)."""

    def __init__(self, errors: dict[str, TenantStepError], results: dict[str, dict[str, Any]]) -> None:
        names = ', '.join(f'{n} ({e.stage})' for n, e in errors.items())
        super().__init__(
            f'{len(errors)} tenant(s) rejected in a mixed step: {names}. ' + ' | '.join(str(e) for e in errors.values())
        )
        self.errors, self.results = errors, results
