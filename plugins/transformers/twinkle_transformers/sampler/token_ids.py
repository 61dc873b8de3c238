"""The special token ids a sampler needs of a model and its tokenizer: where sequences end, what pads prompts."""

from __future__ import annotations

from typing import Any


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a sequence: the model's generation config's and the tokenizer's EOS ids."""
    ids: set[int] = set()
    gen_config = getattr(model, 'generation_config', None)
    for source in (getattr(gen_config, 'eos_token_id', None), getattr(tokenizer, 'eos_token_id', None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return frozenset(ids)


def pad_token_id(model: Any, tokenizer: Any) -> int:
    """The id prompts are left-padded with: the tokenizer's, else the model config's, else an EOS id, else 0."""
    for candidate in (
        getattr(tokenizer, 'pad_token_id', None),
        getattr(model.config, 'pad_token_id', None),
        *sorted(eos_token_ids(model, tokenizer)),
    ):
        if isinstance(candidate, int):
            return candidate
    return 0
