"""Per-token candidate matrices: K values per position (e.g. Tinker's ``(N, K)`` ``target_tokens`` / ``weights``).

The input processor collates 1-D per-token fields only, so a row carries a ``[n, K]`` matrix ``name`` as K
per-token fields ``name:0`` ... ``name:{K-1}`` (each aligned with ``input_ids`` like any per-token field) plus the
per-row field ``name:K`` = K. Rows of one batch may differ in K: the collation fills a row's missing columns with
0. A loss reads the matrix back with `stack` ([B, T, Kmax]), scores candidate token ids with `candidate_logps` (from
the logits: the loss sets ``needs_logits``) and hands per-row results back with `per_row` under
`ROW_CANDIDATE_LOGPS` in its metrics (the model host turns them into the per-datum ``(N, K)`` log-probs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.chunking import default_chunk_tokens

#: metrics key of a loss's per-row candidate log-probs: one [n - 1][K] list per row (positions 0 .. n - 2 of the
#: shifted layout, i.e. the row's predictions), popped by the model host before metrics reach a client
ROW_CANDIDATE_LOGPS = 'rows/candidate_logps'


def column(name: str, k: int) -> str:
    """The per-token field holding column `k` of matrix `name`."""
    return f'{name}:{k}'


def width_field(name: str) -> str:
    """The per-row field holding the K of matrix `name` in that row."""
    return f'{name}:K'


def add_matrix(row: dict[str, Any], name: str, matrix: list[list[float]]) -> None:
    """Store `matrix` ([n][K], aligned with the row's ``input_ids``) in `row` as `name`'s columns and width."""
    width = len(matrix[0]) if matrix else 0
    for k in range(width):
        row[column(name, k)] = [float(values[k]) for values in matrix]
    row[width_field(name)] = width


def stack(inputs: dict[str, Any], name: str) -> Tensor | None:
    """Matrix `name` of a collated batch as [B, T, Kmax] (float32), or None when the batch has no column of it."""
    columns: list[Tensor] = []
    while column(name, len(columns)) in inputs:
        columns.append(torch.as_tensor(inputs[column(name, len(columns))]))
    return torch.stack(columns, dim=-1) if columns else None


def widths(inputs: dict[str, Any], name: str) -> list[int]:
    """Each row's K of matrix `name` (rows without it count 0)."""
    values = inputs.get(width_field(name))
    if values is None:
        return [0] * len(inputs['row_lengths'])
    return [int(v) if v is not None else 0 for v in torch.as_tensor(values).tolist()]


def row_spans(inputs: dict[str, Any]) -> list[tuple[int, int, int]]:
    """Where each row's predictions lie in the [B, T] layout: ``(b, start, stop)`` with ``stop - start`` = its
    length - 1 (padded: row b from 0; packed: row 0 at the row's offset)."""
    lengths: list[int] = list(inputs['row_lengths'])
    if not inputs.get('packed'):
        return [(b, 0, n - 1) for b, n in enumerate(lengths)]
    spans, start = [], 0
    for n in lengths:
        spans.append((0, start, start + n - 1))
        start += n
    return spans


def per_row(inputs: dict[str, Any], values: Tensor, row_widths: list[int]) -> list[list[list[float]]]:
    """[B, T, K] values as one [n - 1][K_row] list per row (see `row_spans`)."""
    flat = values.detach().float().cpu()
    return [flat[b, s:e, :k].tolist() for (b, s, e), k in zip(row_spans(inputs), row_widths)]


class _CandidateLogProbs(torch.autograd.Function):
    """log_softmax(logits)[ids] over [N, V] logits and [N, K] ids, in chunks of rows; saves only the logsumexp."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, ids: Tensor, chunk: int) -> Tensor:
        n = logits.shape[0]
        out = torch.empty(ids.shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        for s in range(0, n, chunk):
            x = logits[s : s + chunk].float()
            lse[s : s + chunk] = torch.logsumexp(x, dim=-1)
            out[s : s + chunk] = x.gather(1, ids[s : s + chunk]) - lse[s : s + chunk, None]
        ctx.save_for_backward(logits, ids, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        logits, ids, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        grad_out = grad_out.float()
        for s in range(0, logits.shape[0], ctx.chunk):
            g = grad_out[s : s + ctx.chunk]
            # d(sum_k g_k * (x[id_k] - lse)) / dx = scatter(g) - softmax(x) * sum_k g_k
            p = logits[s : s + ctx.chunk].float().sub_(lse[s : s + ctx.chunk, None]).exp_()
            d = p.mul_(-g.sum(-1, keepdim=True)).scatter_add_(1, ids[s : s + ctx.chunk], g)
            grad[s : s + ctx.chunk] = d.to(grad.dtype)
        return grad, None, None


def candidate_logps(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """Log-probability of every candidate id: ``log_softmax(logits)[..., ids[..., k]]`` as float32 [B, T, K].

    `logits` [B, T, V], `ids` [B, T, K] (any numeric dtype holding token ids), `mask` [B, T] (loss positions).
    Ids outside ``[0, V)`` at a loss position raise `InvalidInputError` naming it; elsewhere they score 0.
    Differentiable w.r.t. `logits`; the backward keeps only the (already alive) logits and a logsumexp per token.
    """
    vocab = logits.shape[-1]
    ids = ids.to(device=logits.device, dtype=torch.long)
    bad = ((ids < 0) | (ids >= vocab)) & mask.unsqueeze(-1)
    if bool(bad.any()):
        b, t, k = (int(i) for i in bad.nonzero()[0])
        raise InvalidInputError(
            f'candidate token id {int(ids[b, t, k])} at row {b}, position {t}, column {k} is outside the '
            f'vocabulary [0, {vocab}).'
        )
    safe = torch.where(mask.unsqueeze(-1), ids, 0)
    chunk = default_chunk_tokens(vocab)  # bounds the float32 copy of the logits
    flat = _CandidateLogProbs.apply(logits.reshape(-1, vocab), safe.reshape(-1, ids.shape[-1]), chunk)
    return torch.where(mask.unsqueeze(-1), flat.view(ids.shape), 0.0)
