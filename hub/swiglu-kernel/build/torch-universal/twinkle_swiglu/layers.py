"""Kernel layers (Hugging Face `kernels` rules: no __init__, no extra members, the replaced forward's signature;
`self` is the replaced module)."""
import torch
import torch.nn.functional as F


class _SiluAndMul(torch.autograd.Function):
    """silu(gate) * up as one autograd node: it keeps `gate` and `up` for backward and recomputes silu(gate),
    where plain autograd also keeps silu(gate) -- one activation-sized tensor less per MLP layer."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        # the same ops autograd runs for F.silu(gate) * up, so the gradients are bit-identical
        grad_up = grad * F.silu(gate) if ctx.needs_input_grad[1] else None
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        return grad_gate, grad_up


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluAndMul.apply(gate, up)
    return F.silu(gate) * up


class SwiGLUMLP(torch.nn.Module):
    """Replaces gated MLPs (`gate_proj`, `up_proj`, `down_proj`, `act_fn`; Qwen3MLP, LlamaMLP, ...). A model
    whose activation is not SiLU keeps the original computation."""
    has_backward = True
    can_torch_compile = False

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        if getattr(getattr(self, 'config', None), 'hidden_act', None) in ('silu', 'swish'):
            return self.down_proj(silu_and_mul(gate, up))
        return self.down_proj(self.act_fn(gate) * up)
