"""Per-token log-probs and argmax from vocabulary-parallel logits, without gathering the vocabulary.

Each tensor-parallel rank holds logits for its slice of the padded vocabulary ``[.., V_padded / tp]``. Padded
columns (ids >= the real vocabulary size) are excluded from the softmax here, so the log-probs equal those of the
unpadded Hugging Face model. The log-sum-exp, the target logit and the argmax are combined across the tp group
with three small all-reduces / one all-gather; the backward needs no communication (the logits' gradient is
local). Losses that need the full logits (``needs_logits``) get them from `full_logits`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from twinkle_core.types import IGNORE_INDEX


def _local_range(logits: Tensor, group: Any) -> tuple[int, int]:
    rank = dist.get_rank(group) if group is not None else 0
    width = logits.shape[-1]
    return rank * width, (rank + 1) * width


def _masked(logits: Tensor, start: int, vocab_size: int) -> Tensor:
    """fp32 logits with the padded vocabulary columns at -inf."""
    x = logits.float()
    valid = x.shape[-1] if start + x.shape[-1] <= vocab_size else max(0, vocab_size - start)
    if valid < x.shape[-1]:
        x = x.clone()
        x[..., valid:] = float('-inf')
    return x


class _VocabParallelLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        targets: Tensor,
        vocab_size: int,
        group: Any,
    ) -> Tensor:
        start, end = _local_range(logits, group)
        x = _masked(logits, start, vocab_size)
        size = dist.get_world_size(group) if group is not None else 1
        m = x.max(dim=-1).values
        if size > 1:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        sum_exp = (x - m.unsqueeze(-1)).exp().sum(dim=-1)
        local = (targets >= start) & (targets < end)
        idx = torch.where(local, targets - start, 0)
        target_logit = torch.where(local, x.gather(-1, idx.unsqueeze(-1)).squeeze(-1), 0.0)
        if size > 1:
            reduced = torch.stack([sum_exp, target_logit])
            dist.all_reduce(reduced, group=group)
            sum_exp, target_logit = reduced[0], reduced[1]
        lse = m + sum_exp.log()
        ctx.save_for_backward(logits, lse, idx, local)
        ctx.start, ctx.vocab_size = start, vocab_size
        return target_logit - lse

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        logits, lse, idx, local = ctx.saved_tensors
        x = _masked(logits, ctx.start, ctx.vocab_size)
        g = grad.float().unsqueeze(-1)
        d = (x - lse.unsqueeze(-1)).exp_().mul_(-g)  # -g * softmax; padded columns: exp(-inf) = 0
        d.scatter_add_(-1, idx.unsqueeze(-1), torch.where(local.unsqueeze(-1), g, 0.0))
        return d.to(logits.dtype), None, None, None


def vocab_parallel_logps(logits: Tensor, targets: Tensor, vocab_size: int, group: Any = None) -> Tensor:
    """log p(target) as float32 ``[B, S]`` from tp-sharded logits ``[B, S, V_padded / tp]``; positions whose target
    is ``-100`` get 0 and no gradient. `group`: the tensor-parallel group (None: one rank)."""
    valid = targets != IGNORE_INDEX
    logps = _VocabParallelLogProbs.apply(logits, torch.where(valid, targets, 0), vocab_size, group)
    return torch.where(valid, logps, 0.0)


@torch.no_grad()
def vocab_parallel_argmax(logits: Tensor, vocab_size: int, group: Any = None) -> Tensor:
    """The argmax over the real vocabulary of tp-sharded logits, as global token ids ``[B, S]``."""
    start, _ = _local_range(logits, group)
    x = _masked(logits, start, vocab_size)
    value, index = x.max(dim=-1)
    size = dist.get_world_size(group) if group is not None else 1
    if size == 1:
        return index
    values = [torch.empty_like(value) for _ in range(size)]
    indices = [torch.empty_like(index) for _ in range(size)]
    dist.all_gather(values, value, group=group)
    dist.all_gather(indices, index + start, group=group)
    best = torch.stack(values).argmax(dim=0, keepdim=True)  # ties: the lowest rank, i.e. the lowest id
    return torch.stack(indices).gather(0, best).squeeze(0)


def full_logits(logits: Tensor, vocab_size: int, group: Any = None) -> Tensor:
    """The whole vocabulary's logits ``[B, S, V]`` (gathered over tp, differentiable, padding dropped)."""
    size = dist.get_world_size(group) if group is not None else 1
    if size > 1:
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

        logits = gather_from_tensor_model_parallel_region(logits)
    return logits[..., :vocab_size]
