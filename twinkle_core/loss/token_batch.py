"""`TokenBatch`: how RL and preference losses read a collated micro-batch.

One place for the rules every such loss follows (see docs/rl.md, "Inputs and validation"):

- ``labels`` [B, T] (already shifted, -100 = no loss) and ``outputs['logps']`` [B, T] are required.
- Rows: in a padded batch row ``b`` is ``labels[b]``; in a padding-free packed batch (``row_index`` [B, T] present)
  every position belongs to row ``row_index[b, t]``. Sequence-level quantities (sums, per-row advantages, DPO
  pairs) are computed per row in both layouts.
- A per-token field must have exactly the shape of ``labels``; a per-row field holds one value per row.
- A missing required field raises `InvalidInputError` naming the field and the loss.
- NaN policy: values at masked positions are ignored -- replaced by 0 *before* any arithmetic, so a NaN there
  (e.g. the NaN prompt logprob at position 0 of a Tinker `compute_logprobs`) never reaches the loss or a
  gradient. A NaN or inf at a loss position raises `InvalidInputError` naming the field, row and position.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX


def row_end_values(x: torch.Tensor, row_lengths: list[int], *, packed: bool) -> torch.Tensor:
    """`x` [B, T] at the last position of each row of a collated batch -> [num_rows]: row ``b``'s
    ``row_lengths[b] - 1`` in a padded batch, the rows one after another on one line in a packed one."""
    lengths = torch.as_tensor(row_lengths, device=x.device)
    if packed:
        return x.reshape(-1)[lengths.cumsum(0) - 1]
    return x[torch.arange(len(row_lengths), device=x.device), lengths - 1]


class TokenBatch:
    """The loss positions, rows and validated fields of one collated micro-batch, for the loss `loss_name`."""

    def __init__(
        self, inputs: dict[str, Any], outputs: dict[str, Any], loss_name: str, *, reads: str = 'logps'
    ) -> None:
        """`reads`: the per-token model output [B, T] the loss reads -- ``'logps'`` (log-probs of the labels), or
        ``'values'`` (a value / reward head's output, `PPOValueLoss`, `BradleyTerryLoss`) -- kept as `output`."""
        self.inputs, self.loss_name = inputs, loss_name
        output = outputs.get(reads)
        if output is None:
            what = 'log-probs of the labels' if reads == 'logps' else 'outputs of a value head (a value model)'
            raise InvalidInputError(
                f'{loss_name}: outputs[{reads!r}] is missing; the model must return per-token {what} (shape [B, T]).'
            )
        labels = self._tensor('labels', inputs.get('labels'), dtype=torch.long, device=output.device)
        if labels.shape != output.shape:
            raise InvalidInputError(
                f'{loss_name}: labels have shape {tuple(labels.shape)} but outputs[{reads!r}] '
                f'has shape {tuple(output.shape)}; they must match.'
            )
        self.mask: torch.Tensor = labels != IGNORE_INDEX
        self.output: torch.Tensor = self.masked(output)
        self.rows, self.num_rows = self._row_ids(inputs.get('row_index'))
        self._num_tokens: int | None = None

    @property
    def logps(self) -> torch.Tensor:
        """The per-token log-probs (the output read, for the losses that read ``'logps'``), 0 where masked."""
        return self.output

    # ---- layout -------------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """Number of loss positions (a host sync on first use; cached)."""
        if self._num_tokens is None:
            self._num_tokens = int(self.mask.sum())
        return self._num_tokens

    @property
    def dtype(self) -> torch.dtype:
        return self.output.dtype

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        """`x` with every position outside the loss set to 0 (no NaN and no gradient leaks from there)."""
        return torch.where(self.mask, x, torch.zeros((), dtype=x.dtype, device=x.device))

    def row_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of the per-token tensor `x` over each row's loss positions -> [num_rows]."""
        x = self.masked(x)
        out = torch.zeros(self.num_rows, dtype=x.dtype, device=x.device)
        return out.index_add(0, self.rows.reshape(-1), x.reshape(-1))

    def row_tokens(self) -> torch.Tensor:
        """Number of loss positions of each row -> [num_rows] (in the loss dtype)."""
        return self.row_sum(self.mask.to(self.dtype))

    def row_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of `x` over each row's loss positions -> [num_rows] (0 for a row without loss positions)."""
        return self.row_sum(x) / self.row_tokens().clamp(min=1)

    def broadcast_rows(self, values: torch.Tensor) -> torch.Tensor:
        """A per-row tensor [num_rows] -> per-token [B, T] (each position gets its row's value)."""
        return values[self.rows]

    def row_final(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [B, T] at each row's last position (its last token, whatever its label) -> [num_rows]: what a
        reward head reads after the whole sequence. Needs the collated ``row_lengths``."""
        lengths = self.inputs.get('row_lengths')
        if lengths is None or len(lengths) != self.num_rows:
            raise InvalidInputError(f"{self.loss_name} needs the collated batch's 'row_lengths' (one per row).")
        return row_end_values(x, lengths, packed=bool(self.inputs.get('packed')))

    def token_sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.masked(x).sum()

    def token_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over loss positions / number of loss positions (0 when there are none)."""
        return self.token_sum(x) / self.mask.sum().clamp(min=1).to(x.dtype)

    def sequence_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean over rows of each row's token mean; rows without loss positions are left out (0 if all are)."""
        counts = self.row_tokens()
        rows_with_tokens = (counts > 0).sum().clamp(min=1).to(x.dtype)
        return (self.row_sum(x) / counts.clamp(min=1)).sum() / rows_with_tokens

    # ---- fields -------------------------------------------------------------------------------------------
    @overload
    def token_field(self, name: str, *, required: Literal[True] = ...) -> torch.Tensor: ...
    @overload
    def token_field(self, name: str, *, required: bool) -> torch.Tensor | None: ...
    def token_field(self, name: str, *, required: bool = True) -> torch.Tensor | None:
        """Per-token field `name` [B, T], validated, with masked positions set to 0 (None if absent and optional)."""
        value = self.inputs.get(name)
        if value is None:
            if required:
                raise self.missing(name, 'per-token [B, T] like labels')
            return None
        tensor = self._tensor(name, value, dtype=self.dtype, device=self.output.device)
        if tensor.shape != self.mask.shape:
            raise InvalidInputError(
                f'{self.loss_name}: per-token field {name!r} has shape {tuple(tensor.shape)} but labels have shape '
                f'{tuple(self.mask.shape)}; give one value per token, aligned with labels.'
            )
        return self._finite_at_loss_positions(name, tensor)

    @overload
    def row_field(self, name: str, *, required: Literal[True] = ...) -> torch.Tensor: ...
    @overload
    def row_field(self, name: str, *, required: bool) -> torch.Tensor | None: ...
    def row_field(self, name: str, *, required: bool = True) -> torch.Tensor | None:
        """Per-row field `name` [num_rows], validated (None if absent and optional)."""
        value = self.inputs.get(name)
        if value is None:
            if required:
                raise self.missing(name, f'per-row [{self.num_rows}]')
            return None
        tensor = self._tensor(name, value, dtype=self.dtype, device=self.output.device).reshape(-1)
        if tensor.numel() != self.num_rows:
            raise InvalidInputError(
                f'{self.loss_name}: per-row field {name!r} has {tensor.numel()} values but the batch has '
                f'{self.num_rows} rows; give one value per row.'
            )
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise InvalidInputError(
                f'{self.loss_name}: {name!r} of row {row} is {tensor[row].item()}; it must be finite.'
            )
        return tensor

    def advantages(self) -> torch.Tensor:
        """Per-token advantages [B, T]: the field ``advantages`` [B, T], or the per-row ``advantage`` broadcast."""
        if self.inputs.get('advantages') is not None:
            return self.token_field('advantages')
        if self.inputs.get('advantage') is not None:
            return self.broadcast_rows(self.row_field('advantage'))
        raise self.missing('advantages', f"per-token [B, T], or a per-row 'advantage' [{self.num_rows}]")

    def missing(self, name: str, shape: str) -> InvalidInputError:
        return InvalidInputError(
            f'{self.loss_name} needs the input field {name!r} ({shape}); it is missing from '
            f'the batch (fields present: {sorted(self.inputs)}).'
        )

    # ---- helpers ------------------------------------------------------------------------------------------
    def _tensor(self, name: str, value: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if value is None:
            raise self.missing(name, 'per-token [B, T]')
        try:
            return torch.as_tensor(value, dtype=dtype, device=device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidInputError(
                f'{self.loss_name}: field {name!r} cannot be read as a tensor ({exc}); a '
                'per-token field needs one value per token of every row (as many as its '
                'input_ids).'
            ) from exc

    def _finite_at_loss_positions(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        bad = ~torch.isfinite(tensor) & self.mask
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise InvalidInputError(
                f'{self.loss_name}: {name!r} is {tensor[b, t].item()} at row {b}, position {t}, which is a loss '
                'position; values must be finite wherever labels != -100 (masked positions may hold anything).'
            )
        return self.masked(tensor)

    def _row_ids(self, row_index: Any) -> tuple[torch.Tensor, int]:
        batch, length = self.mask.shape
        if row_index is None:
            rows = torch.arange(batch, device=self.mask.device).unsqueeze(1).expand(batch, length)
            return rows, batch
        rows = self._tensor('row_index', row_index, dtype=torch.long, device=self.mask.device)
        if rows.shape != self.mask.shape:
            raise InvalidInputError(
                f'{self.loss_name}: row_index has shape {tuple(rows.shape)} but labels have '
                f'shape {tuple(self.mask.shape)}.'
            )
        if bool((rows[self.mask] < 0).any()):
            raise InvalidInputError(f'{self.loss_name}: row_index is negative at a loss position.')
        rows = rows.clamp(min=0)  # padding may carry -1; it is masked anyway
        return rows, int(rows.max()) + 1 if rows.numel() else 0
