"""GKD: generalised knowledge distillation with the generalised Jensen-Shannon divergence (Agarwal et al., 2024).

Per loss position, with ``S = log_softmax(student_logits / temperature)``, ``P = log_softmax(teacher_logits /
temperature)`` over the vocabulary::

    beta == 0:  KL(teacher || student)                         (forward KL, "supervised KD")
    beta == 1:  KL(student || teacher)                         (reverse KL)
    otherwise:  M = log((1 - beta) * exp(S) + beta * exp(P))
                beta * KL(teacher || M) + (1 - beta) * KL(student || M)

averaged over loss positions (``token_mean``). The student's logits come from the forward (``needs_logits``):
full logits [B, T, V], or -- when the model computes log-probs from its hidden states (``logps_from_hidden_states``:
by default when the batch's fp32 logits would exceed one chunk, `twinkle_core.loss.chunking`) -- its final hidden
states and output embedding (``accepts_hidden_states``). The loss then works ``chunk_tokens`` loss positions at a
time: each chunk's student and teacher logits are built, used and rebuilt in the backward, never [T, V] at once.
The teacher's logits come from, in this order:

1. the input ``teacher_logits`` [B, T, V], aligned with ``labels`` like every per-token field (``[b, t]`` is the
   teacher's distribution for the token ``labels[b, t]``) -- for callers that collate batches themselves;
2. ``teacher_model`` (a causal LM module, or a model directory loaded on first use): run without gradients on the
   same collated batch (``input_ids``, ``position_ids``, ``attention_mask``), so nothing [T, V]-sized has to
   travel through data pipelines or the network. On the chunked path a teacher whose output layer is a plain
   projection (`plain_output_head`) gives its final hidden states, and its logits are built chunk by chunk too.

Student and teacher must share a vocabulary. On- vs off-policy distillation differs only in where the sequences
come from (the student's own samples vs a fixed dataset); the loss is the same.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.chunking import default_chunk_tokens, plain_output_head
from twinkle_core.loss.token_batch import TokenBatch

#: about how many [chunk, V] fp32 tensors one chunk of the divergence holds at once (student and teacher logits and
#: log-softmaxes, the mixture, the KL terms): the default chunk is one logits chunk (`default_chunk_tokens`) / this
CHUNK_COPIES = 8


class GKDLoss(Loss):
    """Generalised JSD between student and teacher token distributions at every loss position."""

    rows_independent = True
    row_keywords = frozenset()
    needs_logits = True
    accepts_hidden_states = True
    reduction = 'token_mean'

    def __init__(
        self,
        beta: float = 0.5,
        temperature: float = 1.0,
        teacher_model: Any = None,
        *,
        logps_from_hidden_states: bool | None = None,
        chunk_tokens: int | None = None,
    ) -> None:
        if not 0.0 <= beta <= 1.0:
            raise InvalidInputError(f'GKDLoss: beta must be in [0, 1], got {beta}.')
        if temperature <= 0:
            raise InvalidInputError(f'GKDLoss: temperature must be > 0, got {temperature}.')
        if chunk_tokens is not None and chunk_tokens < 1:
            raise InvalidInputError(f'GKDLoss: chunk_tokens must be >= 1, got {chunk_tokens}.')
        self.beta, self.temperature = float(beta), float(temperature)
        self.teacher_model = teacher_model  # a module, a model directory (loaded on first use) or None
        self.logps_from_hidden_states, self.chunk_tokens = logps_from_hidden_states, chunk_tokens

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'GKDLoss')
        if outputs.get('logits') is not None:
            divergence = self._divergence_from_logits(batch, outputs['logits'])
        elif outputs.get('hidden_states') is not None and outputs.get('output_weight') is not None:
            divergence = self._divergence_in_chunks(batch, outputs['hidden_states'], outputs['output_weight'])
        else:
            raise InvalidInputError(
                "GKDLoss: outputs['logits'] (or 'hidden_states' + 'output_weight') are missing; the model must keep "
                'full logits (GKDLoss.needs_logits is True).'
            )
        return LossOutput(loss=batch.token_mean(divergence), num_tokens=batch.num_tokens)

    # ---- the two layouts of the student's distribution ---------------------------------------------------------
    def _divergence_from_logits(self, batch: TokenBatch, student_logits: torch.Tensor) -> torch.Tensor:
        """[B, T] divergences from the student's full logits [B, T, V]."""
        teacher_logits = self._teacher_logits(batch, tuple(student_logits.shape), student_logits.device)
        if teacher_logits is None:
            teacher_logits = self._model_teacher_logits(batch, tuple(student_logits.shape), student_logits.device)
        return self._divergence(student_logits, teacher_logits)

    def _divergence_in_chunks(self, batch: TokenBatch, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """[B, T] divergences from the student's final hidden states [B, T, H] and output embedding [V, H],
        ``chunk_tokens`` loss positions at a time: a chunk's student and teacher logits are built, used and
        dropped, and rebuilt in the backward (activation checkpointing), so no [T, V] tensor is ever held."""
        rows, length, vocab = hidden.shape[0], hidden.shape[1], weight.shape[0]
        positions = batch.mask.reshape(-1).nonzero().squeeze(1)
        student = hidden.reshape(rows * length, -1).index_select(0, positions)
        teacher, teacher_weight = self._teacher_rows(batch, positions, (rows, length, vocab), hidden.device)
        chunk = self.chunk_tokens or max(1, default_chunk_tokens(vocab) // CHUNK_COPIES)
        parts = [
            checkpoint(
                self._chunk_divergence,
                student[s : s + chunk],
                weight,
                teacher[s : s + chunk],
                teacher_weight,
                use_reentrant=False,
            )
            for s in range(0, positions.numel(), chunk)
        ]
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        values = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=dtype)
        flat = torch.zeros(rows * length, dtype=values.dtype, device=hidden.device)
        return flat.index_put((positions,), values).view(rows, length)

    def _chunk_divergence(
        self, student: torch.Tensor, weight: torch.Tensor, teacher: torch.Tensor, teacher_weight: torch.Tensor | None
    ) -> torch.Tensor:
        teacher_logits = teacher if teacher_weight is None else teacher @ teacher_weight.T
        return self._divergence(student @ weight.T, teacher_logits)

    def _divergence(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(student_logits.dtype, torch.float32)
        student = F.log_softmax(student_logits.to(dtype) / self.temperature, dim=-1)
        teacher = F.log_softmax(teacher_logits.to(dtype) / self.temperature, dim=-1)
        return generalized_jsd(student, teacher, self.beta)

    # ---- the teacher ---------------------------------------------------------------------------------------------
    def _teacher_logits(self, batch: TokenBatch, shape: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
        """The input ``teacher_logits`` (checked), None when a ``teacher_model`` is to compute them; an error when
        neither is there."""
        value = batch.inputs.get('teacher_logits')
        if value is None and self.teacher_model is not None:
            return None
        if value is None:
            raise InvalidInputError(
                "GKDLoss needs the input field 'teacher_logits' ([B, T, V] aligned with labels) or a teacher_model= "
                f'to compute them; neither was given (fields present: {sorted(batch.inputs)}).'
            )
        teacher = self._checked_shape(torch.as_tensor(value, device=device), shape)
        return self._checked_teacher_logits(batch, teacher)

    def _teacher_rows(
        self, batch: TokenBatch, positions: torch.Tensor, shape: tuple[int, int, int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The teacher at the loss `positions` (flat indices into [B * T]): ``(logits [N, V], None)``, or
        ``(final hidden states [N, H'], output embedding [V, H'])`` when a ``teacher_model`` with a plain output
        layer runs (its logits are then built chunk by chunk too)."""
        teacher = self._teacher_logits(batch, shape, device)
        if teacher is None:
            hidden_head = self._run_teacher_hidden(batch.inputs, device)
            if hidden_head is not None:
                hidden, weight = hidden_head
                if weight.shape[0] != shape[2]:
                    raise InvalidInputError(
                        f'GKDLoss: the teacher has a vocabulary of {weight.shape[0]} tokens but the student has '
                        f'{shape[2]}; teacher and student need the same vocabulary.'
                    )
                return hidden.reshape(shape[0] * shape[1], -1).index_select(0, positions), weight
            teacher = self._model_teacher_logits(batch, shape, device)
        return teacher.reshape(shape[0] * shape[1], -1).index_select(0, positions), None

    def _model_teacher_logits(self, batch: TokenBatch, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """``teacher_model``'s full logits on the batch, checked like the input ``teacher_logits``."""
        teacher = self._checked_shape(self._run_teacher(batch.inputs, device), shape)
        return self._checked_teacher_logits(batch, teacher)

    @staticmethod
    def _checked_shape(teacher: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        if tuple(teacher.shape) != shape:
            raise InvalidInputError(
                f'GKDLoss: teacher_logits have shape {tuple(teacher.shape)} but the student logits have shape '
                f'{shape}; teacher and student need the same [B, T] layout and vocabulary.'
            )
        return teacher

    @staticmethod
    def _checked_teacher_logits(batch: TokenBatch, teacher: torch.Tensor) -> torch.Tensor:
        """`teacher` with non-loss positions zeroed; an error when a loss position is not finite."""
        bad = ~torch.isfinite(teacher).all(dim=-1) & batch.mask
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise InvalidInputError(
                f'GKDLoss: teacher_logits are not finite at row {b}, position {t} (a loss position).'
            )
        return torch.where(
            batch.mask.unsqueeze(-1), teacher, torch.zeros((), dtype=teacher.dtype, device=teacher.device)
        )

    def _loaded_teacher(self, device: torch.device) -> torch.nn.Module:
        if isinstance(self.teacher_model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM

            # transformers types `PreTrainedModel.to` via functools.wraps(nn.Module.to), which loses the bound self
            self.teacher_model = AutoModelForCausalLM.from_pretrained(
                os.fspath(self.teacher_model), dtype=torch.float32
            ).to(device)  # type: ignore[arg-type]
        teacher = self.teacher_model
        teacher.eval()
        return teacher

    @staticmethod
    def _teacher_kwargs(teacher: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        teacher_device = next(teacher.parameters()).device
        kwargs = {
            name: inputs[name].to(teacher_device)
            for name in ('input_ids', 'position_ids', 'attention_mask')
            if isinstance(inputs.get(name), torch.Tensor)
        }
        if 'input_ids' not in kwargs:
            raise InvalidInputError('GKDLoss: running teacher_model needs the collated input_ids in the batch.')
        return kwargs

    @torch.no_grad()
    def _run_teacher(self, inputs: dict[str, Any], device: torch.device) -> torch.Tensor:
        """The teacher's full logits [B, T, V] on the collated batch."""
        teacher = self._loaded_teacher(device)
        return teacher(**self._teacher_kwargs(teacher, inputs), use_cache=False).logits.to(device)

    @torch.no_grad()
    def _run_teacher_hidden(
        self, inputs: dict[str, Any], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The teacher's final hidden states [B, T, H'] and output embedding [V, H'], or None when its output
        layer is not a plain projection (`plain_output_head`)."""
        teacher = self._loaded_teacher(device)
        head = plain_output_head(teacher)
        if head is None:
            return None
        decoder, weight = head
        hidden = decoder(**self._teacher_kwargs(teacher, inputs), use_cache=False).last_hidden_state
        return hidden.to(device), weight.detach().to(device)


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
