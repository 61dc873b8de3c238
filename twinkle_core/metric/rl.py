"""`PolicyUpdateMetric`: how far the policy moved in an RL step -- clip fraction, approximate KLs, entropy.

Works on a collated batch (``labels`` [B, T], optional per-token ``old_logps`` / ``ref_logps``) and the forward's
outputs (``logps`` [B, T], optional ``logits`` [B, T, V]). Every statistic is a mean over loss tokens
(labels != -100) of the whole accumulation window:

- ``clip_frac``: tokens whose ratio ``r = exp(logps - old_logps)`` lies outside ``[1 - epsilon, 1 + epsilon_high]``;
- ``approx_kl``: k3 estimate of KL(old || new), ``r - 1 - log r`` (needs ``old_logps``);
- ``kl_ref``: k3 estimate of KL(new || ref), ``exp(ref - logps) - (ref - logps) - 1`` (needs ``ref_logps``);
- ``entropy``: mean token entropy of the new policy (needs ``logits``).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.loss.token_batch import TokenBatch
from twinkle_core.metric.base import Metric


class PolicyUpdateMetric(Metric):
    """RL policy-update diagnostics; see the module docstring."""

    def __init__(self, epsilon: float = 0.2, epsilon_high: float | None = None) -> None:
        self.epsilon_low = float(epsilon)
        self.epsilon_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @torch.no_grad()
    def accumulate(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> None:
        batch = TokenBatch(inputs, outputs, type(self).__name__)
        lp = batch.logps.detach()
        old = batch.token_field('old_logps', required=False)
        if old is not None:
            ratio = torch.exp(lp - old)
            outside = (ratio < 1.0 - self.epsilon_low) | (ratio > 1.0 + self.epsilon_high)
            self._add(batch, 'clip_frac', outside.to(lp.dtype))
            self._add(batch, 'approx_kl', ratio - 1.0 - (lp - old))
        ref = batch.token_field('ref_logps', required=False)
        if ref is not None:
            self._add(batch, 'kl_ref', torch.exp(ref - lp) - (ref - lp) - 1.0)
        logits = outputs.get('logits')
        if logits is not None:
            probs = torch.softmax(logits.detach().float(), dim=-1)
            self._add(batch, 'entropy', torch.special.entr(probs).sum(-1).to(lp.dtype))

    def calculate(self) -> dict[str, float]:
        return {name: total / max(self.counts[name], 1) for name, total in self.sums.items()}

    def _add(self, batch: TokenBatch, name: str, per_token: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(batch.token_sum(per_token))
        self.counts[name] = self.counts.get(name, 0) + batch.num_tokens
