"""A multi-tenant call (`ModelCapabilities.mixed_adapters`), the same for every backend: how its inputs split per
tenant (`split_by_tenant`) and what it returns to its caller (`call_outcome`: one tenant's result or its error
raised, or per-tenant results with the failed tenants' errors raised together as `MixedStepError` or inline)."""

from __future__ import annotations

from typing import Any, Callable

from twinkle_core.errors import InvalidInputError
from twinkle_core.model.step_errors import MixedStepError, TenantStepError


def split_by_tenant(
    inputs: Any, adapter_name: str | None, name_of: Callable[[str | None], str], *, pinned: bool = False
) -> tuple[dict[str, Any], bool]:
    """A call's `inputs` as ({adapter: rows}, whether the caller asked for per-tenant results): rows of one adapter
    (`name_of(adapter_name)`: the adapter a call addresses), ``{adapter_name: rows}``, or rows that each carry an
    ``adapter_name`` field (unless the model is `pinned` to an adapter, e.g. by ``model.adapter(...)``)."""
    if isinstance(inputs, dict) and 'input_ids' not in inputs:
        if adapter_name is not None:
            raise InvalidInputError('pass either adapter_name= with rows, or {adapter_name: rows}, not both.')
        if not inputs:
            raise InvalidInputError('inputs is an empty dict; expected {adapter_name: rows, ...}.')
        return dict(inputs), True
    rows = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    if adapter_name is None and not pinned and rows and all(isinstance(r, dict) and 'adapter_name' in r for r in rows):
        grouped: dict[str, list[Any]] = {}
        for row in rows:
            grouped.setdefault(row['adapter_name'], []).append(row)
        return grouped, True
    return {name_of(adapter_name): inputs}, False


def call_outcome(
    names: list[str],
    results: dict[str, dict[str, Any]],
    errors: dict[str, TenantStepError],
    mixed: bool,
    *,
    return_errors: bool,
) -> dict[str, Any]:
    """The caller's result of a call over tenants `names` (each in `results` or in `errors`): the one tenant's
    result (or its error raised) when the call was not `mixed`; else ``{name: result}``, failed tenants raised
    together as `MixedStepError` or, with `return_errors`, inline as ``{'error': {...}}``."""
    if not names:
        raise InvalidInputError('the call has no rows on any data rank; pass at least one row.')
    if not mixed:
        (name,) = names
        if name in errors:
            raise errors[name]
        return results[name]
    if errors and not return_errors:
        raise MixedStepError(errors, results)
    return {name: results[name] if name in results else {'error': errors[name].to_dict()} for name in names}
