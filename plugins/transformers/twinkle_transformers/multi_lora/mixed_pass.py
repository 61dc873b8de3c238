"""One forward (and backward) of the base model over the micro-batches of several tenants: `MixedPass`.

1. the pass's rows are collated tenant after tenant, every position carrying its tenant's adapter slot
   (``adapter_index``; padding gets -1), and run in ONE forward with per-token LoRA routing;
2. each tenant's loss is computed on its own rows with its own loss; a loss that raises or is not finite rejects
   that tenant only; the healthy losses (each times its accumulation scale and its `TenantWork.share`) are summed
   and backpropagated ONCE;
3. each tenant's fresh gradients are checked: non-finite ones are discarded and the tenant rejected; gradients
   accumulated by earlier micro-batches are kept aside during the pass and restored untouched either way.

Tenants use disjoint parameters and (in a padded batch) disjoint rows, so a rejected tenant changes nothing of
anybody else. Which tenants share a pass, and what happens when a shared pass fails, is `passes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from twinkle_core.model.step_errors import TenantStepError
from twinkle_core.train.loss_step import rows_logprobs, run_loss, step_summary
from twinkle_core.train.state import TrainState
from twinkle_transformers.forward import forward_logps
from twinkle_transformers.multi_lora.manager import MultiLoraManager
from twinkle_transformers.multi_lora.tenant_batch import slice_outputs, slice_rows

INDEX_FIELD = 'adapter_index'


@dataclass
class TenantWork:
    """One tenant's micro-batch in a pass: validated rows and the tenant's training state."""

    name: str
    state: TrainState
    rows: list[dict[str, Any]]
    compute_loss: bool = True  # False: forward only for logprobs (no loss, no metrics)
    share: float = 1.0  # this micro-batch's part of the call's loss (a piece of a split call: `tenant_split`)
    summaries: list[dict[str, Any]] | None = None  # set: accepted summaries go here instead of `state.record`
    result: dict[str, Any] | None = None
    error: TenantStepError | None = None
    sub_batch: dict[str, Any] | None = field(default=None, repr=False)  # its rows of the collated batch
    sub_outputs: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    _stash: list[torch.Tensor | None] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class _LossNeeds:
    """What the forward must produce so that every tenant's loss can run (see `forward_logps`)."""

    needs_logits: bool
    logps_from_hidden_states: bool | None  # None: by the batch's size (`wants_hidden_state_logps`)
    chunk_tokens: int | None
    accepts_hidden_states: bool = False  # every loss that needs the logits can take hidden states instead

    @classmethod
    def of(cls, losses: list[Any]) -> _LossNeeds:
        chunks = [c for c in (getattr(loss, 'chunk_tokens', None) for loss in losses) if c]
        choices = {getattr(loss, 'logps_from_hidden_states', None) for loss in losses}
        # one loss asking for full logits decides; all asking for hidden states too; else the size decides
        hidden = False if False in choices else True if choices == {True} else None
        needing = [loss for loss in losses if getattr(loss, 'needs_logits', False)]
        return cls(
            bool(needing),
            hidden,
            min(chunks) if chunks else None,
            accepts_hidden_states=all(getattr(loss, 'accepts_hidden_states', False) for loss in needing),
        )


class MixedPass:
    """One shared pass over `group` (tenants with compatible processors), in phases:

    `forward()` collates and runs the model (each tenant's logprobs land in its result); `losses()` runs each
    tenant's loss on its rows (rejecting raising/non-finite ones); `backward()` backpropagates the healthy losses
    once, checks each tenant's fresh gradients and records metrics. `run()` does all three. A shared failure
    (collation, forward, backward) raises `StageError`, leaving every adapter's gradients as they were.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        manager: MultiLoraManager,
        group: list[TenantWork],
        *,
        train: bool,
        device: torch.device | None = None,
        lockstep: bool = False,
    ) -> None:
        self.model, self.manager, self.group, self.train, self.device = model, manager, group, train, device
        self.lockstep = lockstep  # a sharded base: every rank backpropagates every pass (`data_parallel`)
        self.batch: dict[str, Any] | None = None
        self.outputs: dict[str, torch.Tensor] | None = None
        self.total: torch.Tensor | None = None
        self._losses_done = False

    def run(self) -> None:
        self.forward()
        self.losses()
        self.backward()

    def forward(self) -> None:
        rows: list[dict[str, Any]] = []
        bounds: list[tuple[int, int]] = []
        for w in self.group:
            w.result, w.error = None, None
            slot = self.manager.slot(w.name)
            bounds.append((len(rows), len(rows) + len(w.rows)))
            rows += [{**row, INDEX_FIELD: slot} for row in w.rows]
        try:
            batch = self.group[0].state.processor(rows, device=self.device)
        except Exception as exc:
            raise StageError('input', exc) from exc
        needs = _LossNeeds.of([w.state.loss for w in self.group])
        try:
            with self.manager.adapter_indices(batch[INDEX_FIELD]), torch.set_grad_enabled(self.train):
                outputs = forward_logps(self.model, batch, loss=needs)
        except Exception as exc:
            raise StageError('forward', exc) from exc
        for w, (start, end) in zip(self.group, bounds):
            w.sub_batch = slice_rows(batch, start, end, {key for row in w.rows for key in row})
            w.sub_outputs = slice_outputs(outputs, batch, start, end)
            w.result = {'logprobs': rows_logprobs(w.sub_batch, w.sub_outputs['target_logps'])}
        self.batch, self.outputs = batch, outputs

    def losses(self) -> None:
        if self.outputs is None:
            self.forward()
        if self._losses_done:
            return
        with torch.set_grad_enabled(self.train):
            for w in self.group:
                scaled = _tenant_loss(w, train=self.train)
                if scaled is not None:
                    self.total = scaled if self.total is None else self.total + scaled
            if self.lockstep and self.train and self.total is None and self.outputs is not None:
                # nothing to train on this rank: a zero loss through every layer keeps the ranks' collectives paired
                self.total = self.outputs['target_logps'].sum() * 0.0
        self._losses_done = True

    def backward(self) -> None:
        self.losses()
        if self.train and self.total is not None and self.total.requires_grad:
            assert self.batch is not None  # a loss to backpropagate means the forward ran
            for w in self.group:
                stash_grads(self.manager, w)
            try:
                with self.manager.adapter_indices(self.batch[INDEX_FIELD]):  # recomputation sees the same routing
                    self.total.backward()
            except Exception as exc:
                for w in self.group:
                    restore_grads(self.manager, w, keep_new=False)
                raise StageError('backward', exc) from exc
            for w in self.group:
                keep = w.error is None and _grads_finite(self.manager, w)
                if w.error is None and not keep:
                    w.result = None
                    w.error = TenantStepError(
                        w.name,
                        'gradient',
                        'the gradients of this micro-batch are not '
                        'finite (NaN/inf); they were discarded and the adapter is unchanged.',
                    )
                restore_grads(self.manager, w, keep_new=keep)
        self.total = None
        for w in self.group:  # metrics only for tenants whose micro-batch was accepted
            summary = w.result.pop('_summary', None) if w.result is not None else None
            if w.error is None and summary is not None:
                if w.summaries is not None:
                    w.summaries.append(summary)
                else:
                    w.state.record(summary, is_training=self.train)
            w.sub_batch = w.sub_outputs = None


def _tenant_loss(w: TenantWork, *, train: bool) -> torch.Tensor | None:
    """Compute tenant `w`'s loss on its rows, fill `w.result` (or `w.error`); return the scaled loss to add to
    the backward (None when rejected or when nothing is trained)."""
    if w.error is not None:
        return None
    sub_batch, sub_out, result = w.sub_batch, w.sub_outputs, w.result
    assert sub_batch is not None and sub_out is not None and result is not None  # filled by MixedPass.forward
    if not w.compute_loss or (not train and not bool(sub_out['mask'].any())):
        return None  # logprobs only: nothing to score, no metrics
    try:
        out = run_loss(w.state.loss, sub_batch, sub_out)
    except Exception as exc:
        w.result, w.error = None, TenantStepError(w.name, 'loss', f'{type(exc).__name__}: {exc}')
        return None
    loss = out['loss']
    value = float(loss.detach())
    if not math.isfinite(value):
        w.result, w.error = (
            None,
            TenantStepError(
                w.name,
                'loss',
                f'the loss is {value}; check this batch (e.g. '
                'NaN/inf in advantages, weights or reference logprobs). Nothing '
                'was applied.',
            ),
        )
        return None
    result.update(loss=value, metrics=dict(out.get('metrics') or {}), _summary=step_summary(sub_batch, sub_out, loss))
    return loss * (w.state.loss_scale() * w.share) if train else None


def stash_grads(manager: MultiLoraManager, w: TenantWork) -> None:
    """Set the gradients accumulated so far aside, so this pass's gradients can be checked on their own."""
    params = manager.parameters(w.name)
    w._stash = [p.grad for p in params]
    for p in params:
        p.grad = None


def restore_grads(manager: MultiLoraManager, w: TenantWork, *, keep_new: bool) -> None:
    """Put the set-aside gradients back; add this pass's gradients to them when `keep_new`."""
    put_back(manager.parameters(w.name), w._stash, keep_new=keep_new)
    w._stash = []


def put_back(params: list[torch.nn.Parameter], earlier: list[torch.Tensor | None], *, keep_new: bool) -> None:
    """Give `params` their `earlier` gradients again, plus the ones they hold now when `keep_new`."""
    for p, old in zip(params, earlier):
        new = p.grad if keep_new else None
        p.grad = old if new is None else (new if old is None else old.add_(new))


def _grads_finite(manager: MultiLoraManager, w: TenantWork) -> bool:
    grads = [p.grad for p in manager.parameters(w.name) if p.grad is not None]
    if not grads:
        return True
    # One reduction and one sync per tenant. (A norm overflowing float32 counts as non-finite too, as it would
    # when the optimizer step clips by norm.)
    return bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))


class StageError(Exception):
    """A failure of the shared pass itself (`stage`: 'input' = collation, 'forward' or 'backward')."""

    def __init__(self, stage: Literal['input', 'forward', 'backward'], cause: BaseException) -> None:
        super().__init__(f'{type(cause).__name__}: {cause}')
        self.stage = stage


def as_tenant_error(name: str, exc: BaseException) -> TenantStepError:
    """`exc` (raised by a pass that `name` was alone in) as that tenant's error."""
    if isinstance(exc, TenantStepError):
        return exc
    if isinstance(exc, StageError):
        return TenantStepError(name, exc.stage, str(exc))
    return TenantStepError(name, 'forward', f'{type(exc).__name__}: {exc}')
