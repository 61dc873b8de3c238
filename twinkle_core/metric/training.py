"""Metrics every training step reports: loss, token accuracy, throughput.

They fold the small per-micro-batch summary a model builds after each forward (torch-free floats):
``outputs = {'loss': float, 'num_loss_tokens': int, 'num_correct': int, 'num_tokens': int}``
(`num_tokens`: real, non-padding tokens of the batch). `inputs` is not read.
"""

from __future__ import annotations

import time
from typing import Any

from twinkle_core.metric.base import Metric


class LossMetric(Metric):
    """Mean loss over the micro-batches of the window (``loss``)."""

    def __init__(self) -> None:
        self.reset()

    def accumulate(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> None:
        self.total += float(outputs['loss'])
        self.count += 1

    def calculate(self) -> dict[str, float]:
        return {'loss': self.total / self.count} if self.count else {}

    def reset(self) -> None:
        self.total, self.count = 0.0, 0


class TokenAccuracy(Metric):
    """Share of loss tokens whose argmax prediction equals the label (``token_accuracy``)."""

    def __init__(self) -> None:
        self.reset()

    def accumulate(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> None:
        self.correct += int(outputs.get('num_correct', 0))
        self.total += int(outputs.get('num_loss_tokens', 0))

    def calculate(self) -> dict[str, float]:
        return {'token_accuracy': self.correct / self.total} if self.total else {}

    def reset(self) -> None:
        self.correct, self.total = 0, 0


class Throughput(Metric):
    """Real tokens per wall-clock second since the window opened (``tokens_per_second``, ``num_tokens``)."""

    def __init__(self) -> None:
        self.reset()

    def accumulate(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> None:
        self.tokens += int(outputs.get('num_tokens', 0))
        self.last = time.perf_counter()

    def calculate(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        elapsed = max(self.last - self.start, 1e-9)
        return {'tokens_per_second': self.tokens / elapsed, 'num_tokens': float(self.tokens)}

    def reset(self) -> None:
        self.tokens = 0
        self.start = self.last = time.perf_counter()
