"""The Tinker-SDK helpers of the Twinkle documents: `init_tinker_client` (``from twinkle_core import
init_tinker_client``) and `input_feature_to_datum` (``from twinkle_core.server.common import
input_feature_to_datum``). Both need the ``tinker`` package, imported on first call.

`init_tinker_client` prepares the official ``tinker`` SDK for a twinkle server (the documents call it before
``from tinker import ServiceClient``). A twinkle server speaks the Tinker wire API, so the SDK needs no patching:
this checks that ``tinker`` is installed and, when given, puts the server's address and key where the SDK reads
its defaults (``TINKER_BASE_URL``, ``TINKER_API_KEY``), so ``ServiceClient()`` needs no arguments.

`input_feature_to_datum` turns a twinkle row into a Tinker `Datum`. A row's ``labels`` are aligned with its
``input_ids`` (-100 = no loss); a Datum's input position i predicts ``target_tokens[i]``. So ``model_input =
input_ids[:-1]``, ``target_tokens = input_ids[1:]`` (a label, where set, wins) and ``weights`` is 1 where the
shifted label is set, else 0 -- the exact inverse of what the server does with a Datum
(`twinkle_server.api.tinker.datums.to_rows`).
"""

from __future__ import annotations

import os
from typing import Any

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.types import IGNORE_INDEX, as_input_features, as_list


def init_tinker_client(base_url: str | None = None, api_key: str | None = None) -> Any:
    """Returns the ``tinker`` module. Raises `TwinkleError` with the install line when it is missing."""
    try:
        import tinker
    except ImportError as exc:
        raise TwinkleError(f'The Tinker SDK is not installed ({exc}). Run: pip install tinker') from exc
    if base_url is not None:
        os.environ['TINKER_BASE_URL'] = base_url
    if api_key is not None:
        os.environ['TINKER_API_KEY'] = api_key
    return tinker


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
    inputs: dict[str, Any] = {'target_tokens': targets, 'weights': weights}  # the SDK turns lists into TensorData
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs)
