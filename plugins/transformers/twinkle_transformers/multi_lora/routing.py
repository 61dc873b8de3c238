"""Which adapter each token uses: the router shared by every multi-LoRA layer of one model.

The router holds the *current* token -> adapter-slot map (set by `MultiLoraManager.adapter_indices` /
`use_adapter`). Each forward turns it into a `SegmentPlan` once — tokens sorted by slot, one contiguous segment
per slot — and every layer of that forward reuses it (the plan is cached per input shape and device).

The router is a plain object, not a contextvar, on purpose: activation recomputation (gradient checkpointing)
runs layer forwards again during backward, possibly on autograd's device threads, and must see the same map.
So keep the backward inside the same `with` block as the forward. One router serves one pass at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

BASE_ONLY = -1  # adapter index of tokens that use the base model only (padding, base-model rows)


@dataclass(frozen=True)
class SegmentPlan:
    """How the tokens of one forward split across adapters.

    `uniform_slot` is set when every token uses the same slot (then no gather/scatter is needed).
    Otherwise `order` lists the flat token positions that use an adapter, sorted by slot (stable), and
    `segments` holds ``(slot, start, end)`` ranges into `order`. Base-only tokens appear in neither.
    `offset` is set when `order` is just ``offset, offset + 1, ...`` (tenants already laid out one after another,
    e.g. a packed batch): layers then read the tokens as a view instead of gathering a copy.
    """

    uniform_slot: int | None
    order: torch.Tensor | None
    segments: tuple[tuple[int, int, int], ...]
    offset: int | None = None


class AdapterRouter:
    """The current token -> adapter-slot map of one model, and its per-forward segment plans."""

    def __init__(self, validate_slots: Callable[[list[int]], None] | None = None) -> None:
        self._validate_slots = validate_slots
        self._uniform: int | None = None
        self._index: torch.Tensor | None = None
        self._plans: dict[tuple, SegmentPlan] = {}

    @property
    def active(self) -> bool:
        return self._uniform is not None or self._index is not None

    def state(self) -> tuple[int | None, torch.Tensor | None]:
        return self._uniform, self._index

    def restore(self, state: tuple[int | None, torch.Tensor | None]) -> None:
        self._uniform, self._index = state
        self._plans = {}

    def set_uniform(self, slot: int | None) -> None:
        """Route every token to `slot` (None: no routing, layers compute the base model only)."""
        if slot is not None and self._validate_slots is not None:
            self._validate_slots([slot])
        self._uniform, self._index, self._plans = slot, None, {}

    def set_index(self, index: torch.Tensor) -> None:
        """Route by an integer tensor: per row ``[B]`` or per token ``[B, T]`` (packed: ``[1, T]``).

        Values are adapter slots or `BASE_ONLY` (-1). Unknown slots raise here, before any forward runs.
        """
        import torch

        if not isinstance(index, torch.Tensor) or index.dtype not in (
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
        ):
            raise TypeError(
                f'adapter index must be an integer torch.Tensor, got {type(index).__name__}'
                f'{"" if not isinstance(index, torch.Tensor) else " of dtype " + str(index.dtype)}.'
            )
        if index.dim() not in (1, 2):
            raise ValueError(f'adapter index must have shape [B] or [B, T], got {tuple(index.shape)}.')
        index = index.long()
        if self._validate_slots is not None:
            self._validate_slots(torch.unique(index).tolist())
        self._uniform, self._index, self._plans = None, index, {}

    def plan_for(self, x: torch.Tensor) -> SegmentPlan | None:
        """The segment plan for activations `x` of shape ``[..., features]``; None when routing is off."""
        if self._uniform is not None:
            return SegmentPlan(self._uniform, None, ())
        if self._index is None:
            return None
        lead = tuple(x.shape[:-1])
        key = (lead, x.device)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _build_plan(_expand(self._index, lead).to(x.device))
        return plan


def _expand(index: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """The adapter `index` ([B] or [B, T]) laid out over activations with leading shape `lead`."""
    if tuple(index.shape) == lead:
        return index
    if index.dim() == 1 and len(lead) == 2 and lead[0] == index.shape[0]:  # per-row index, [B, T] tokens
        return index[:, None].expand(lead)
    raise ValueError(
        f'adapter index of shape {tuple(index.shape)} does not match activations with leading '
        f'shape {lead}: pass one index per row [B] or one per token {list(lead)}.'
    )


def _build_plan(index: torch.Tensor) -> SegmentPlan:
    import torch

    flat = index.reshape(-1)
    sorted_slots, order = torch.sort(flat, stable=True)
    slots, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
    slots, counts = slots.tolist(), counts.tolist()
    if len(slots) == 1:
        return SegmentPlan(None if slots[0] == BASE_ONLY else slots[0], None, ())
    skip = counts[0] if slots[0] == BASE_ONLY else 0
    segments, start = [], 0
    for slot, count in zip(slots, counts):
        if slot == BASE_ONLY:
            continue
        segments.append((slot, start, start + count))
        start += count
    order = order[skip:]
    first = int(order[0])
    contiguous = bool(torch.equal(order, torch.arange(first, first + order.numel(), device=order.device)))
    return SegmentPlan(None, order, tuple(segments), first if contiguous else None)
