"""One tenant's call larger than a pass may hold: its rows in several passes, with the result of one.

The planner's cap (`max_pass_tokens`) bounds what tenants *share*; a single tenant's call above it would still run
in one pass, and its activations grow with its tokens (32 multi-turn episodes of a 135M model, ~13k tokens, hold
~20 GB on CPU). `split_rows` cuts such a call into consecutive pieces of at most the cap, and `run_pieces` runs
them one pass each, as one call:

- each piece's loss is weighted by its share of the call's loss (`micro_batch_shares`: its loss tokens for
  ``token_mean``, its rows for ``sequence_mean``, 1 for ``sum``), so the gradients, the loss and the metrics are
  those of one pass over all rows (up to float summation order);
- all or nothing: the tenant's gradients from earlier calls are set aside first; if any piece is rejected
  (its loss or gradients not finite, its rows not collating) the pieces' gradients are dropped, the earlier ones
  restored, and the tenant gets that piece's error; nothing of its metrics is recorded. An accepted call is
  recorded as one micro-batch (its loss, tokens and correct tokens), as it would be unsplit.

Only losses whose rows are independent of each other split (``rows_independent = True``: cross-entropy, the
policy-gradient and GRPO losses, GKD, the value loss); a loss that pairs or compares rows (DPO, ORPO, KTO, reward
models) keeps the call in one pass. A forward without a loss (log-probs only) always splits.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from twinkle_core.model.step_errors import TenantStepError
from twinkle_core.train.loss_step import micro_batch_shares
from twinkle_transformers.multi_lora.manager import MultiLoraManager
from twinkle_transformers.multi_lora.mixed_pass import TenantWork, restore_grads, stash_grads
from twinkle_transformers.multi_lora.pass_planner import TenantSize, pass_cost_tokens

Rows = list[dict[str, Any]]


def split_rows(w: TenantWork, cap: int | None, *, packed: bool) -> list[Rows] | None:
    """`w`'s rows as consecutive pieces of at most `cap` cost tokens (`pass_cost_tokens`; a row longer than the cap
    is a piece of its own), or None when the call stays whole: no cap, one row, within the cap, or a loss whose
    rows depend on each other (not ``rows_independent``)."""
    if cap is None or len(w.rows) < 2 or cost_tokens(w.rows, packed) <= cap:
        return None
    if w.compute_loss and not getattr(w.state.loss, 'rows_independent', False):
        return None
    pieces: list[Rows] = [[]]
    for row in w.rows:
        if pieces[-1] and cost_tokens([*pieces[-1], row], packed) > cap:
            pieces.append([])
        pieces[-1].append(row)
    return pieces


def run_pieces(
    manager: MultiLoraManager,
    w: TenantWork,
    pieces: list[Rows],
    run_pass: Callable[[list[TenantWork], int], None],
    *,
    packed: bool,
    train: bool,
) -> None:
    """Run `w`'s `pieces` (from `split_rows`) one pass each (``run_pass([piece], cost_tokens)`` fills the piece's
    result or error) and fill `w.result` / `w.error` as one pass over all its rows would (module docstring)."""
    work = [
        dataclasses.replace(w, rows=rows, summaries=[], result=None, error=None, sub_batch=None, sub_outputs=None)
        for rows in pieces
    ]
    if w.compute_loss:
        try:
            batches = [w.state.processor(piece.rows) for piece in work]
        except Exception as exc:
            w.result, w.error = None, TenantStepError(w.name, 'input', f'{type(exc).__name__}: {exc}')
            return
        shares, _ = micro_batch_shares(getattr(w.state.loss, 'reduction', None), batches)
        for piece, share in zip(work, shares):
            piece.share = share
    if train:
        stash_grads(manager, w)
    failed: TenantStepError | None = None
    for i, piece in enumerate(work):
        run_pass([piece], cost_tokens(piece.rows, packed))
        if piece.error is not None:
            start = sum(len(p) for p in pieces[:i])
            where = (
                f'this call ran in {len(pieces)} pieces (it exceeds max_pass_tokens): the error is in the piece of '
                f'rows {start}-{start + len(pieces[i]) - 1}; row numbers above count from {start}'
            )
            failed = TenantStepError(w.name, piece.error.stage, f'{piece.error.detail} ({where})')
            break
    if train:
        restore_grads(manager, w, keep_new=failed is None)
    w.result, w.error = (None, failed) if failed is not None else (_merged(work), None)
    summaries = [summary for piece in work for summary in piece.summaries or ()]
    if w.result is not None and summaries:  # the call counts as one micro-batch, as it would unsplit
        counts = {key: sum(s[key] for s in summaries) for key in ('num_loss_tokens', 'num_correct', 'num_tokens')}
        summary = {'loss': w.result['loss'], **counts}
        if w.summaries is not None:  # the caller records it (`data_parallel`, after the ranks agree)
            w.summaries.append(summary)
        else:
            w.state.record(summary, is_training=train)


def _merged(work: list[TenantWork]) -> dict[str, Any]:
    """One result from the pieces': log-probs in row order; loss and metrics weighted by the pieces' shares."""
    results = [piece.result or {} for piece in work]
    merged: dict[str, Any] = {'logprobs': [row for r in results for row in r.get('logprobs', [])]}
    scored = [(piece.share, r) for piece, r in zip(work, results) if 'loss' in r]
    total = sum(share for share, _ in scored)
    if scored:
        merged['loss'] = sum(share * r['loss'] for share, r in scored)  # shares sum to 1, or are 1 each for 'sum'
        metrics: dict[str, float] = {}
        for share, r in scored:
            for name, value in (r.get('metrics') or {}).items():
                if isinstance(value, (int, float)):
                    metrics[name] = metrics.get(name, 0.0) + value * share / (total or 1.0)
        merged['metrics'] = metrics
    return merged


def cost_tokens(rows: Rows, packed: bool) -> int:
    """Cost tokens of one pass over `rows` (`pass_cost_tokens`)."""
    return pass_cost_tokens([TenantSize.of([len(row['input_ids']) for row in rows])], packed=packed)
