"""`input_feature_to_datum`: a twinkle row as a Tinker `Datum` (the Twinkle documents' module path).

A row's ``labels`` are aligned with its ``input_ids`` (-100 = no loss); a Datum's input position i predicts
``target_tokens[i]``. So ``model_input = input_ids[:-1]``, ``target_tokens = input_ids[1:]`` (a label, where set,
wins) and ``weights`` is 1 where the shifted label is set, else 0 -- the exact inverse of what the server does
with a Datum (`twinkle_server.tinker.datums.to_rows`). Needs the ``tinker`` package.
"""

from __future__ import annotations

from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX, as_input_features, as_list


def input_feature_to_datum(feature: Any) -> Any:
    """One row (an InputFeature or dict with ``input_ids`` and ``labels``) -> ``tinker.types.Datum`` for the
    ``cross_entropy`` loss."""
    from tinker import types

    row = as_input_features(feature)[0]
    ids = [int(t) for t in as_list(row['input_ids'])]
    labels = [int(t) for t in as_list(row.get('labels') if row.get('labels') is not None else ids)]
    if len(ids) < 2:
        raise InvalidInputError(f'a Datum needs a row of at least 2 tokens, got {len(ids)}.')
    targets = [t if label == IGNORE_INDEX else label for t, label in zip(ids[1:], labels[1:])]
    weights = [0.0 if label == IGNORE_INDEX else 1.0 for label in labels[1:]]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={'target_tokens': targets, 'weights': weights}
    )
