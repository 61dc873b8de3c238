"""Tinker `Datum` -> twinkle `InputFeature` rows (the accepted loss names are in `tinker.losses`).

A Datum's input position i predicts `target_tokens[i]`; an InputFeature's `labels` are aligned with
`input_ids` (docs/conventions.md), so: `input_ids = tokens + [target_tokens[-1]]`, `labels = [-100] + target_tokens`
and every per-token tensor `x` becomes `[0] + x`. Same logits, same targets: exact.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from twinkle_core.types import IGNORE_INDEX
from twinkle_server.errors import unprocessable
from twinkle_server.tinker.losses import tinker_loss
from twinkle_server.tinker.wire import WireDatum

#: Tinker loss_fn_inputs name -> InputFeature per-token field
FIELD_NAMES = {'weights': 'weights', 'logprobs': 'old_logps', 'advantages': 'advantages'}


def to_rows(data: list[WireDatum], loss_fn: str) -> list[dict[str, Any]]:
    required = tinker_loss(loss_fn).inputs
    rows = []
    for i, d in enumerate(data):
        missing = [k for k in required if k not in d.inputs]
        if missing:
            raise unprocessable(f'datum {i}: loss_fn {loss_fn!r} needs loss_fn_inputs {list(required)}, '
                                f'missing {missing}')
        targets = np.asarray(d.inputs['target_tokens']).astype(np.int64).reshape(-1).tolist()
        row: dict[str, Any] = {'input_ids': d.tokens + [targets[-1]], 'labels': [IGNORE_INDEX] + targets}
        for name, field in FIELD_NAMES.items():
            if name in d.inputs:
                row[field] = [0.0] + np.asarray(d.inputs[name], dtype=np.float64).reshape(-1).tolist()
        if loss_fn == 'cross_entropy' and 'weights' not in row:
            row['weights'] = [0.0] + [1.0] * len(targets)
        rows.append(row)
    return rows


def datum_logprobs(row_logprobs: list[list[float]]) -> list[list[float]]:
    """Row log-probs (aligned with input_ids, element 0 = 0.0) -> per-datum Tinker log-probs."""
    return [lp[1:] for lp in row_logprobs]
