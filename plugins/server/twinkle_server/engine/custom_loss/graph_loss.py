"""`GraphLoss`: an uploaded custom loss (`program.CustomLossSpec`) as a twinkle `Loss` -- its program once per datum
on that datum's log-probs and declared inputs, the request's loss the sum over datums (`program`'s docstring has
the contract). An evaluation past its time budget disables the graph for its tenant (`guard`)."""

from __future__ import annotations

from typing import Any

import torch

import twinkle_core.loss.candidates as cand
from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_server.engine.custom_loss import cost
from twinkle_server.engine.custom_loss.guard import GUARD
from twinkle_server.engine.custom_loss.ops import GraphError
from twinkle_server.engine.custom_loss.program import CustomLossSpec, LossInput, input_field


class GraphLoss(Loss):
    """A `CustomLossSpec` as a loss: per datum, its program on that datum's log-probs and inputs (module docstring);
    a sum over datums. Reads ``outputs['logps']``, or the logits for rank-2 log-probs (candidate matrix
    ``target_tokens``), whose per-row values it returns under `candidates.ROW_CANDIDATE_LOGPS`."""

    reduction = 'sum'

    def __init__(self, config: dict[str, Any]) -> None:
        try:
            self.spec = CustomLossSpec.from_config(config)
            self.limits = cost.CostLimits.from_config(config.get('limits'))
        except GraphError as exc:
            raise InvalidInputError(f'custom loss: {exc}') from None
        self.tenant, self.loss_id = str(config.get('tenant', '')), str(config.get('loss_id', ''))
        self.needs_logits = self.spec.inputs[0].rank == 2
        self.__name__ = f'custom loss {self.spec.name!r} ({self.loss_id})'

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        mask = outputs['mask']
        logps, lp_widths = outputs['logps'], None
        if self.needs_logits:
            ids = cand.stack(inputs, 'target_tokens')
            if ids is None or outputs.get('logits') is None:
                raise InvalidInputError(f'{self.__name__}: rank-2 logprobs need 2-D target_tokens and the logits')
            logps, lp_widths = cand.candidate_logps(outputs['logits'], ids, mask), cand.widths(inputs, 'target_tokens')
        why = GUARD.disabled(self.tenant, self.spec.digest)
        if why is not None:
            raise InvalidInputError(f'{self.__name__} is disabled: {why}')
        values = logps.float().cpu()
        columns = [self._column(inputs, i) for i in self.spec.inputs[1:]]
        total = None
        sums: dict[str, float] = {}
        spans = cand.row_spans(inputs)
        budget = self.limits.budget(sum(e - s for _, s, e in spans))
        for row, (b, s, e) in enumerate(spans):
            lp = values[b, s:e] if lp_widths is None else values[b, s:e, : lp_widths[row]]
            args = [lp, *(_datum_value(col, row, b, s, e) for col in columns)]
            try:
                loss, metrics = self.spec.program.run(args, f'datum {row}', budget)
            except cost.OverBudget as exc:
                if exc.over_time:
                    GUARD.disable(self.tenant, self.spec.digest, f'an evaluation ran past its time budget ({exc})')
                    raise InvalidInputError(f'{self.__name__}: {exc}; the loss is now disabled') from None
                raise InvalidInputError(f'{self.__name__}: {exc}') from None
            except GraphError as exc:
                raise InvalidInputError(f'{self.__name__}: {exc}') from None
            total = loss if total is None else total + loss
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach())
        assert total is not None  # a request has at least one datum
        total = total.to(device=logps.device, dtype=torch.float32)
        if torch.is_grad_enabled() and logps.requires_grad and not total.requires_grad:
            total = total + logps.sum() * 0.0  # a loss that ignores logprobs still backpropagates (zeros)
        out: dict[str, Any] = {k: v / len(spans) if k.endswith(':mean') else v for k, v in sums.items()}
        if lp_widths is not None:
            out[cand.ROW_CANDIDATE_LOGPS] = cand.per_row(inputs, logps, lp_widths)
        return LossOutput(loss=total, num_tokens=int(mask.sum()), metrics=out)

    @staticmethod
    def _column(inputs: dict[str, Any], item: LossInput) -> tuple[int, Any, list[int] | None]:
        """(rank, the batch's values of input `item` on the CPU, per-row widths for rank 2)."""
        name = input_field(item.name)
        if item.rank == 2:
            matrix = cand.stack(inputs, name)
            if matrix is None:
                raise InvalidInputError(f'custom loss input {item.name!r} (rank 2) is missing from the batch')
            return 2, matrix.float().cpu(), cand.widths(inputs, name)
        if inputs.get(name) is None:
            raise InvalidInputError(f'custom loss input {item.name!r} is missing from the batch')
        return item.rank, torch.as_tensor(inputs[name], dtype=torch.float32).cpu(), None


def _datum_value(column: tuple[int, Any, list[int] | None], row: int, b: int, s: int, e: int) -> torch.Tensor:
    rank, values, widths = column
    if rank == 0:
        return values[row]
    if rank == 1:
        return values[b, s:e]
    assert widths is not None
    return values[b, s:e, : widths[row]]
