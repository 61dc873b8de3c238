"""GKD: generalised knowledge distillation with the generalised Jensen-Shannon divergence (Agarwal et al., 2024).

Per loss position, with ``S = log_softmax(student_logits / temperature)``, ``P = log_softmax(teacher_logits /
temperature)`` over the vocabulary::

    beta == 0:  KL(teacher || student)                         (forward KL, "supervised KD")
    beta == 1:  KL(student || teacher)                         (reverse KL)
    otherwise:  M = log((1 - beta) * exp(S) + beta * exp(P))
                beta * KL(teacher || M) + (1 - beta) * KL(student || M)

averaged over loss positions (``token_mean``). The student's logits come from the forward (``needs_logits``).
The teacher's logits come from, in this order:

1. the input ``teacher_logits`` [B, T, V], aligned with ``labels`` like every per-token field (``[b, t]`` is the
   teacher's distribution for the token ``labels[b, t]``) -- for callers that collate batches themselves;
2. ``teacher_model`` (a causal LM module, or a model directory loaded on first use): run without gradients on the
   same collated batch (``input_ids``, ``position_ids``, ``attention_mask``), so nothing [T, V]-sized has to
   travel through data pipelines or the network.

Student and teacher must share a vocabulary. On- vs off-policy distillation differs only in where the sequences
come from (the student's own samples vs a fixed dataset); the loss is the same.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.token_batch import TokenBatch


class GKDLoss(Loss):
    """Generalised JSD between student and teacher token distributions at every loss position."""

    row_keywords = frozenset()
    needs_logits = True
    reduction = 'token_mean'

    def __init__(self, beta: float = 0.5, temperature: float = 1.0, teacher_model: Any = None) -> None:
        if not 0.0 <= beta <= 1.0:
            raise InvalidInputError(f'GKDLoss: beta must be in [0, 1], got {beta}.')
        if temperature <= 0:
            raise InvalidInputError(f'GKDLoss: temperature must be > 0, got {temperature}.')
        self.beta, self.temperature = float(beta), float(temperature)
        self.teacher_model = teacher_model  # a module, a model directory (loaded on first use) or None

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'GKDLoss')
        student_logits = outputs.get('logits')
        if student_logits is None:
            raise InvalidInputError(
                "GKDLoss: outputs['logits'] is missing; the model must keep full logits (GKDLoss.needs_logits is True)."
            )
        teacher_logits = self._teacher_logits(batch, student_logits)
        dtype = torch.promote_types(student_logits.dtype, torch.float32)
        student = F.log_softmax(student_logits.to(dtype) / self.temperature, dim=-1)
        teacher = F.log_softmax(teacher_logits.to(dtype) / self.temperature, dim=-1)
        divergence = generalized_jsd(student, teacher, self.beta)
        return LossOutput(loss=batch.token_mean(divergence), num_tokens=batch.num_tokens)

    def _teacher_logits(self, batch: TokenBatch, student_logits: torch.Tensor) -> torch.Tensor:
        value = batch.inputs.get('teacher_logits')
        if value is None and self.teacher_model is not None:
            value = self._run_teacher(batch.inputs, student_logits.device)
        if value is None:
            raise InvalidInputError(
                "GKDLoss needs the input field 'teacher_logits' ([B, T, V] aligned with labels) or a teacher_model= "
                f'to compute them; neither was given (fields present: {sorted(batch.inputs)}).'
            )
        teacher = torch.as_tensor(value, device=student_logits.device)
        if teacher.shape != student_logits.shape:
            raise InvalidInputError(
                f'GKDLoss: teacher_logits have shape {tuple(teacher.shape)} but the student logits have shape '
                f'{tuple(student_logits.shape)}; teacher and student need the same [B, T] layout and vocabulary.'
            )
        bad = ~torch.isfinite(teacher).all(dim=-1) & batch.mask
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise InvalidInputError(
                f'GKDLoss: teacher_logits are not finite at row {b}, position {t} (a loss position).'
            )
        return torch.where(
            batch.mask.unsqueeze(-1), teacher, torch.zeros((), dtype=teacher.dtype, device=teacher.device)
        )

    @torch.no_grad()
    def _run_teacher(self, inputs: dict[str, Any], device: torch.device) -> torch.Tensor:
        if isinstance(self.teacher_model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM

            # transformers types `PreTrainedModel.to` via functools.wraps(nn.Module.to), which loses the bound self
            self.teacher_model = AutoModelForCausalLM.from_pretrained(
                os.fspath(self.teacher_model), dtype=torch.float32
            ).to(device)  # type: ignore[arg-type]
        teacher = self.teacher_model
        teacher.eval()
        teacher_device = next(teacher.parameters()).device
        kwargs = {
            name: inputs[name].to(teacher_device)
            for name in ('input_ids', 'position_ids', 'attention_mask')
            if isinstance(inputs.get(name), torch.Tensor)
        }
        if 'input_ids' not in kwargs:
            raise InvalidInputError('GKDLoss: running teacher_model needs the collated input_ids in the batch.')
        return teacher(**kwargs, use_cache=False).logits.to(device)


def generalized_jsd(student_logps: torch.Tensor, teacher_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-position generalised JSD [..] from log-distributions [.., V] (see the module docstring)."""
    if beta == 0.0:
        return _kl(teacher_logps, student_logps)
    if beta == 1.0:
        return _kl(student_logps, teacher_logps)
    mixture = torch.logsumexp(
        torch.stack([student_logps + math.log(1.0 - beta), teacher_logps + math.log(beta)]), dim=0
    )
    return beta * _kl(teacher_logps, mixture) + (1.0 - beta) * _kl(student_logps, mixture)


def _kl(p_logps: torch.Tensor, q_logps: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension, from log-probabilities."""
    return (p_logps.exp() * (p_logps - q_logps)).sum(-1)
