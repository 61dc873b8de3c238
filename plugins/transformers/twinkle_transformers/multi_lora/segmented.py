"""The LoRA deltas of several adapters on one batch, each on its contiguous token segment, as ONE autograd node.

Written with plain autograd, a mixed pass costs per layer: a slice (or split) per adapter, a concatenation of the
deltas, and a full-size ``out + delta``; and in backward: the split's concatenation of the input gradients and the
add's gradient. On large passes these full-size temporaries dominate (memory traffic, page faults of fresh large
allocations). `segmented_lora_` instead adds each adapter's delta into the base output in place and, in backward,
writes each segment's input gradient straight into one buffer.

The matmuls are exactly those autograd runs for ``lora_B(lora_A(x)) * scaling`` (peft's and `LoraWeights`'s
formula) on the same segment, in the same order and with the same operands -- so every adapter's gradients are
bit-identical to the plain-autograd path (tested). Dropout is not handled here: layers with an active dropout use
the plain path.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

Segment = tuple[int, int, float]  # (start, end) rows of the sorted tokens, and the adapter's scaling


class _SegmentedLora(torch.autograd.Function):
    """forward(out, x_sorted, rows, segments, *weights): with ``flat = out.view(-1, out_features)``,
    ``flat[rows of segment] += scaling * B(A(x_sorted[start:end]))`` for each segment, in place. `rows` is an int
    offset (a segment's rows are ``offset + start ... offset + end``) or an index tensor (scatter-add).
    `weights` = A_0, B_0, A_1, B_1, ... (peft layout: A is r x in, B is out x r)."""

    @staticmethod
    def forward(
        ctx: Any,
        out: torch.Tensor,
        x_sorted: torch.Tensor,
        rows: int | torch.Tensor,
        segments: Sequence[Segment],
        *weights: torch.Tensor,
    ) -> torch.Tensor:
        flat = out.view(-1, out.shape[-1])
        hidden = []
        for k, (start, end, scaling) in enumerate(segments):
            a, b = weights[2 * k], weights[2 * k + 1]
            h = torch.mm(x_sorted[start:end].to(a.dtype), a.t())
            delta = (torch.mm(h, b.t()) * scaling).to(out.dtype)
            if isinstance(rows, int):
                flat[rows + start : rows + end].add_(delta)
            else:
                flat.index_add_(0, rows[start:end], delta)
            hidden.append(h)
        ctx.mark_dirty(out)
        ctx.segments, ctx.rows = segments, rows
        ctx.save_for_backward(x_sorted, *hidden, *weights)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        segments, rows, n = ctx.segments, ctx.rows, len(ctx.segments)
        saved = ctx.saved_tensors
        x_sorted, hidden, weights = saved[0], saved[1 : 1 + n], saved[1 + n :]
        grad_flat = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = _empty_but_gaps(x_sorted, segments) if ctx.needs_input_grad[1] else None
        grad_weights: list[torch.Tensor] = []
        for k, (start, end, scaling) in enumerate(segments):
            a, b = weights[2 * k], weights[2 * k + 1]
            g = (
                grad_flat[rows + start : rows + end]
                if isinstance(rows, int)
                else grad_flat.index_select(0, rows[start:end])
            )
            g = g.to(b.dtype) * scaling
            grad_h = torch.mm(g, b)
            # weight gradients as autograd's mm backward computes them for a transposed weight: g^T @ input
            grad_weights += [torch.mm(grad_h.t(), x_sorted[start:end].to(a.dtype)), torch.mm(g.t(), hidden[k])]
            if grad_x is not None:
                grad_x[start:end] = torch.mm(grad_h, a)
        return (grad_out, grad_x, None, None, *grad_weights)


def _empty_but_gaps(x: torch.Tensor, segments: Sequence[Segment]) -> torch.Tensor:
    """A tensor like `x`, zero on the rows no segment covers (the segments' rows are written by the caller)."""
    out = torch.empty_like(x)
    covered = 0
    for start, end, _ in sorted(segments):
        if start > covered:
            out[covered:start].zero_()
        covered = max(covered, end)
    if covered < x.shape[0]:
        out[covered:].zero_()
    return out


def segmented_lora_(
    out: torch.Tensor,
    x_sorted: torch.Tensor,
    rows: int | torch.Tensor,
    segments: Sequence[Segment],
    weights: Sequence[torch.Tensor],
) -> torch.Tensor:
    """Add every adapter's LoRA delta into `out` (the base layer's fresh output) in place, as one autograd node
    (see `_SegmentedLora`); returns `out`."""
    return _SegmentedLora.apply(out, x_sorted, rows, tuple(segments), *weights)
