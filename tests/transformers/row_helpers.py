"""Row builders shared by the Transformers backend tests."""

from __future__ import annotations

import torch


def labelled_rows(seed: int, lengths=(9, 14, 5, 11), prompt: int = 3) -> list[dict]:
    """Rows of random token ids (one per entry of `lengths`) whose first `prompt` tokens are unlabelled."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(3, 1100, (n,), generator=g).tolist()
        rows.append({'input_ids': ids, 'labels': [-100] * prompt + ids[prompt:]})
    return rows
