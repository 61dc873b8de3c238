"""Liger (``liger-kernel``, Triton) for CUDA models: layer kernels and a fused linear cross-entropy loss.

    pip install "twinkle-transformers[liger]"      # CUDA + Triton machines only
    TransformersModel(model_id, device='cuda', kernels=['LigerRMSNorm', 'LigerSwiGLUMLP'])
    model.set_loss('LigerFusedLinearCrossEntropyLoss')

Liger's own ``apply_liger_kernel_to_<model>`` functions patch transformers' classes and module functions for the
whole process, so a CPU model in the same process would then run Triton kernels and fail. twinkle never calls
them: liger's autograd functions are wrapped as layer kernels, installed per module instance by
`twinkle_core.kernel.apply_kernels` (other models in the process are untouched), and declared CUDA-only, so
asking for them on a CPU model is refused before anything changes. Liger is imported when a kernel first runs.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.kernel import LayerKernel
from twinkle_core.loss.cross_entropy import CrossEntropyLoss
from twinkle_core.types import IGNORE_INDEX

MLP_CLASSES = ('Qwen3MLP', 'Qwen2MLP', 'LlamaMLP', 'MistralMLP', 'Qwen3MoeMLP')
#: tagged 'RMSNorm' by twinkle where the installed transformers did not tag them
NORM_CLASSES = ('Qwen3RMSNorm', 'Qwen2RMSNorm', 'LlamaRMSNorm', 'MistralRMSNorm', 'Qwen3MoeRMSNorm')


def _liger(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(f'liger_kernel.ops.{module}')
    except ImportError as exc:
        raise TwinkleError(
            f'Liger kernels need liger-kernel with Triton on a CUDA machine ({exc}). '
            f'Run: pip install "twinkle-transformers[liger]"'
        ) from exc


class LigerRMSNormLayer(torch.nn.Module):
    """Replaces modules tagged 'RMSNorm' (``weight``, ``variance_epsilon``) with Liger's Triton RMSNorm, in the
    Llama casting mode (fp32 normalisation, cast back, then scale: what Qwen3/Llama's forward does)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rms_norm = _liger('rms_norm')
        return rms_norm.LigerRMSNormFunction.apply(
            hidden_states, self.weight, self.variance_epsilon, 0.0, 'llama', False
        )


class LigerSwiGLUMLPLayer(torch.nn.Module):
    """Replaces gated SiLU MLPs (``gate_proj``, ``up_proj``, ``down_proj``) with Liger's fused SiLU-and-mul."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x):
        swiglu = _liger('swiglu')
        return self.down_proj(swiglu.LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))


LIGER_RMSNORM = LayerKernel(
    'LigerRMSNorm',
    LigerRMSNormLayer,
    replaces='RMSNorm',
    decorates=NORM_CLASSES,
    devices=('cuda',),
    source='liger-kernel',
)
LIGER_SWIGLU_MLP = LayerKernel(
    'LigerSwiGLUMLP',
    LigerSwiGLUMLPLayer,
    replaces='SwiGLUMLP',
    decorates=MLP_CLASSES,
    devices=('cuda',),
    source='liger-kernel',
)


class LigerFusedLinearCrossEntropyLoss(CrossEntropyLoss):
    """`CrossEntropyLoss` whose per-token log-probs come from Liger's fused linear cross-entropy: the output
    layer's matmul and the softmax run chunk by chunk in Triton, never materialising the [T, V] logits. Same
    reductions, weights and values as `CrossEntropyLoss` (to float rounding). CUDA models only."""

    logps_from_hidden_states = True

    def logps_from_hidden(
        self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p of `targets` [...] float32, argmax [...]) from the final hidden states and the output weight;
        0 where `targets` is -100."""
        if not hidden.is_cuda:
            raise InvalidInputError(
                f'{type(self).__name__} runs on CUDA models only (Liger is Triton); this model '
                f'is on {hidden.device}. Use ChunkedCrossEntropyLoss for the same memory saving '
                f'on CPU.'
            )
        flce = _liger('fused_linear_cross_entropy')
        flat = targets.reshape(-1)
        token_loss, _, _, predicted = flce.LigerFusedLinearCrossEntropyFunction.apply(
            hidden.reshape(-1, hidden.shape[-1]),
            weight,
            flat,
            None,
            None,
            IGNORE_INDEX,
            0.0,
            0.0,
            'none',
            None,
            False,
            torch.float32,
            False,
            False,
            True,
        )
        logps = torch.where(flat != IGNORE_INDEX, -token_loss.float(), 0.0)
        return logps.view(targets.shape), predicted.view(targets.shape)
