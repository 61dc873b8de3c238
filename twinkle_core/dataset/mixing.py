"""Combining several data sets into one: concatenation or seeded, probability-weighted interleaving."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from twinkle_core.errors import InvalidInputError

StoppingStrategy = Literal['first_exhausted', 'all_exhausted']
MixingStrategy = Literal['concat', 'interleave']


@dataclass(frozen=True)
class Mixing:
    """How `Dataset` combines its parts.

    ``'concat'``: all rows of the first part, then the second, ...
    ``'interleave'``: rows drawn part by part at random with `probabilities` (uniform when None), reproducibly for
    a given `seed`; ``stopping_strategy='first_exhausted'`` stops when any part runs out, ``'all_exhausted'``
    oversamples the smaller parts until every part was seen completely.
    """

    strategy: MixingStrategy = 'concat'
    probabilities: tuple[float, ...] | None = None
    seed: int = 0
    stopping_strategy: StoppingStrategy = 'first_exhausted'

    def __post_init__(self) -> None:
        if self.strategy not in ('concat', 'interleave'):
            raise InvalidInputError(f"mixing must be 'concat' or 'interleave', got {self.strategy!r}.")
        if self.stopping_strategy not in ('first_exhausted', 'all_exhausted'):
            raise InvalidInputError(
                f"stopping_strategy must be 'first_exhausted' or 'all_exhausted', got {self.stopping_strategy!r}."
            )
        if self.probabilities is not None:
            probs = tuple(float(p) for p in self.probabilities)
            if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
                raise InvalidInputError(f'probabilities must be non-negative and sum to 1, got {list(probs)}.')
            object.__setattr__(self, 'probabilities', probs)

    def check(self, num_parts: int) -> None:
        if self.probabilities is not None and len(self.probabilities) != num_parts:
            raise InvalidInputError(f'{len(self.probabilities)} probabilities given for {num_parts} data sets.')
        if self.probabilities is not None and self.strategy != 'interleave':
            raise InvalidInputError("probabilities only apply to mixing='interleave'.")

    def combine(self, parts: Sequence[Any]) -> Any:
        """One Hugging Face `Dataset` out of `parts` (returned as is when there is only one)."""
        import datasets

        self.check(len(parts))
        if len(parts) == 1:
            return parts[0]
        parts = align_struct_lists(parts)
        try:
            if self.strategy == 'concat':
                return datasets.concatenate_datasets(list(parts))
            return datasets.interleave_datasets(
                list(parts), probabilities=self.probabilities, seed=self.seed, stopping_strategy=self.stopping_strategy
            )
        except ValueError as exc:
            columns = [sorted(p.column_names) for p in parts]
            raise InvalidInputError(
                f'Cannot mix data sets with columns {columns}: map them to the same format '
                f'first (e.g. one preprocessor per data set). ({exc})'
            ) from exc


def align_struct_lists(parts: Sequence[Any]) -> list[Any]:
    """Give list-of-struct columns (``messages``) the union of their fields across `parts`.

    One data set's messages may carry ``loss`` while another's do not; Arrow cannot concatenate the two, so the
    missing fields are added as None (a no-op when the schemas already agree).
    """
    import datasets

    union: dict[str, dict[str, Any]] = {}
    for part in parts:
        for column, feature in part.features.items():
            inner = getattr(feature, 'feature', None)
            if isinstance(feature, datasets.List) and isinstance(inner, dict):
                fields = union.setdefault(column, {})
                for key, value in inner.items():
                    fields.setdefault(key, value)
    aligned = []
    for part in parts:
        missing = {
            c: [k for k in fields if k not in part.features[c].feature]
            for c, fields in union.items()
            if c in part.features and isinstance(part.features[c], datasets.List)
        }
        missing = {c: keys for c, keys in missing.items() if keys}
        if missing:
            features = part.features.copy()
            for column in missing:
                features[column] = datasets.List({k: union[column][k] for k in union[column]})
            part = part.map(_add_fields, fn_kwargs={'missing': missing}, features=features, desc='Align message fields')
        aligned.append(part)
    return aligned


def _add_fields(row: dict[str, Any], *, missing: dict[str, list[str]]) -> dict[str, Any]:
    return {
        column: [{**item, **{k: None for k in keys}} for item in row[column] or []] for column, keys in missing.items()
    }
