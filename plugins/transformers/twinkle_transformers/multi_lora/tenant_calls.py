"""A multi-tenant call: how its inputs split per tenant (`split_by_tenant`), what it returns to its caller (one
tenant's result or its error raised, or per-tenant results with the failed tenants' errors raised together as
`MixedStepError` or inline: `step_outcome`), and a `forward` waiting for its `calculate_loss` / `backward`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twinkle_core.errors import InvalidInputError
from twinkle_core.model.step_errors import MixedStepError, TenantStepError
from twinkle_transformers.multi_lora.mixed_pass import MixedPass, TenantWork


@dataclass
class PendingStep:
    """A `forward` waiting for `calculate_loss` / `backward`."""

    work: list[TenantWork]
    errors: dict[str, TenantStepError]
    mixed: bool
    passes: list[MixedPass]
    rank_call: Any = None  # the `data_parallel.RankCall` of a model on several data ranks


def step_outcome(
    work: list[TenantWork], errors: dict[str, TenantStepError], mixed: bool, *, return_errors: bool
) -> dict[str, Any]:
    """The caller's result: one tenant's result (or its error raised), or per-tenant results (errors raised
    together as `MixedStepError`, or inline with `return_errors`)."""
    errors = {**errors, **{w.name: w.error for w in work if w.error is not None}}
    results = {
        w.name: {k: v for k, v in w.result.items() if not k.startswith('_')}
        for w in work
        if w.error is None and w.result is not None
    }
    names = list(dict.fromkeys([*(w.name for w in work), *errors]))
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


def split_by_tenant(
    inputs: Any, adapter_name: str | None, name_of: Callable[[str | None], str], *, pinned: bool
) -> tuple[dict[str, Any], bool]:
    """A call's `inputs` as ({adapter: rows}, whether the caller asked for per-tenant results): rows of one adapter
    (`name_of(adapter_name)`: the adapter a call addresses), ``{adapter_name: rows}``, or rows that each carry an
    ``adapter_name`` field (unless the model is `pinned` to an adapter by `model.adapter(...)`)."""
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
