"""Kernel layers (Hugging Face `kernels` rules: no __init__, no extra members, the replaced forward's signature;
`self` is the replaced module, so its parameters and attributes are used as they are)."""
import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    """Replaces modules tagged 'RMSNorm' that hold `weight` and `variance_epsilon` (Qwen3RMSNorm, LlamaRMSNorm,
    ...): normalise in fp32 with one fused op, cast back to the input dtype, then scale -- the same steps and
    roundings as the original forward."""
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        normed = F.rms_norm(hidden_states.to(torch.float32), (hidden_states.shape[-1],), eps=self.variance_epsilon)
        return self.weight * normed.to(input_dtype)
