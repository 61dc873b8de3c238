"""StableReinforce's stability information: what sampling records and how `forward_backward` uses it.

A sample request with ``record_stability_info=true`` (a sampling client created with `record_stability_info=True`)
records, for each returned sequence, its request's prompt tokens and its sampled tokens with the sampler's
log-probs, under the sequence's ``sequence_id`` (``SampledSequence.sequence_id``). A training datum names them with
`Datum.with_provenance`: ``model_input_spans`` tile its input tokens and ``loss_fn_input_spans`` tile its
``target_tokens``, each span claiming that a run of positions is ``[offset, offset + length)`` of a sequence's
prompt (`PromptProvenanceSpan`) or of its sampled tokens (`SampledProvenanceSpan`).

For ``loss_fn='stable_reinforce'`` every claim is checked against the record (unknown, expired or other-session
ids and tokens that differ are a 422 naming the datum and span), then each datum gets

- ``logprobs`` (the behaviour log-probs ``q``): the sampler's recorded log-prob on every row a sampled span covers
  (the datum's own ``logprobs`` there are ignored), 0 elsewhere;
- the action mask: 1 on rows a sampled span covers, 0 on prompt-span rows (context, not actions).

A datum without provenance keeps its ``logprobs`` and its action mask is "advantage != 0" (`StableReinforceLoss`).

The records themselves (bounded, expiring, per tenant and session) are the service's:
`twinkle_server/service/stability_records.py`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from twinkle_server.api.tinker.wire import Span, WireDatum
from twinkle_server.errors import unprocessable
from twinkle_server.service.stability_records import Recorded

#: the injected per-datum action mask (not a Tinker input name); `datums` turns it into the row field 'action_mask'
ACTION_MASK = '_action_mask'


def apply_provenance(data: list[WireDatum], lookup: Callable[[str], Recorded | None]) -> None:
    """For a `stable_reinforce` request: check every datum's provenance against the records (`lookup`: sequence id
    -> record of the caller's session, or None) and set its ``logprobs`` and action mask (module docstring), in
    place. Datums without provenance get the default action mask (advantage != 0)."""
    for i, d in enumerate(data):
        where = f'datum {i}'
        if d.loss_fn_input_spans is None or d.model_input_spans is None:
            adv = d.inputs.get('advantages')
            if adv is not None:
                d.inputs[ACTION_MASK] = (np.asarray(adv, dtype=np.float64).reshape(-1) != 0).astype(np.float32)
            continue
        if d.has_images:
            raise unprocessable(f'{where}: provenance spans are not supported on datums with image chunks')
        tokens = np.asarray([t for c in d.chunks if isinstance(c, list) for t in c], dtype=np.int64)
        targets = d.inputs.get('target_tokens')
        if targets is None:
            raise unprocessable(f'{where}: stable_reinforce needs loss_fn_inputs["target_tokens"]')
        targets = np.asarray(targets, dtype=np.int64).reshape(-1)
        _check_claims(f'{where} model_input_spans', d.model_input_spans, tokens, lookup, None)
        q = np.zeros(len(targets), dtype=np.float32)
        mask = np.zeros(len(targets), dtype=np.float32)
        _check_claims(f'{where} loss_fn_input_spans', d.loss_fn_input_spans, targets, lookup, (q, mask))
        d.inputs['logprobs'] = q
        d.inputs[ACTION_MASK] = mask


def _check_claims(
    where: str,
    spans: list[Span],
    values: np.ndarray,
    lookup: Callable[[str], Recorded | None],
    out: tuple[np.ndarray, np.ndarray] | None,
) -> None:
    """Every span's run of `values` equals the recorded run it claims; with `out` = (q, mask), sampled runs fill
    q with the recorded log-probs and mask with 1."""
    total = sum(s.length for s in spans)
    if total != len(values):
        raise unprocessable(f'{where}: the spans cover {total} positions but the field has {len(values)}')
    pos = 0
    for k, span in enumerate(spans):
        rec = lookup(span.sequence_id)
        if rec is None:
            raise unprocessable(
                f'{where}[{k}]: no stability information for sequence_id {span.sequence_id!r} (sample with '
                f'record_stability_info=True in this session; records expire a day after their last use)'
            )
        source = rec.tokens if span.sampled else rec.prompt
        what = 'sampled tokens' if span.sampled else 'prompt'
        if span.offset + span.length > len(source):
            raise unprocessable(
                f'{where}[{k}]: [{span.offset}, {span.offset + span.length}) is outside the {len(source)} '
                f'{what} of sequence {span.sequence_id!r}'
            )
        run = values[pos : pos + span.length]
        claimed = source[span.offset : span.offset + span.length]
        if not np.array_equal(run, claimed):
            j = int(np.flatnonzero(run != claimed)[0])
            raise unprocessable(
                f'{where}[{k}]: position {pos + j} holds token {int(run[j])} but {what} position '
                f'{span.offset + j} of sequence {span.sequence_id!r} is {int(claimed[j])}'
            )
        if out is not None and span.sampled:
            q, mask = out
            q[pos : pos + span.length] = rec.logprobs[span.offset : span.offset + span.length]
            mask[pos : pos + span.length] = 1.0
        pos += span.length
