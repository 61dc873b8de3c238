"""Memory-bounded vocabulary work: how big a chunk of logits may be, and when a causal LM's logits can be computed
from its final hidden states chunk by chunk instead of all at once.

A model's full logits are [T, V]; fp32 copies of them (log-softmax, gradients) dominate memory for long rows or
large vocabularies. Code that only needs per-position results (log-probs, divergences) computes them in chunks of
`default_chunk_tokens` positions, each chunk's logits ``hidden[chunk] @ weight.T``, when the model's output layer
is a plain bias-free projection (`plain_output_head`). Pure torch: no model library is imported here.
"""

from __future__ import annotations

from typing import Any

import torch

#: bytes of one chunk of fp32 logits (rows of the vocabulary worked on at once)
CHUNK_BYTES = 1 << 28

#: config attributes of models that post-process their logits (soft-capping, scaling): not a plain projection
LOGIT_POST_PROCESSING = ('final_logit_softcapping', 'logit_scale')


def default_chunk_tokens(vocab_size: int) -> int:
    """Positions per chunk so that a chunk of fp32 logits is about `CHUNK_BYTES` (~256 MiB)."""
    return max(1, CHUNK_BYTES // (4 * max(1, vocab_size)))


def unwrap_causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a PEFT wrapper (``get_base_model()``), or `model` itself."""
    get_base = getattr(model, 'get_base_model', None)
    return get_base() if callable(get_base) else model


def plain_output_layer(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The output layer of a causal LM (a Hugging Face ``PreTrainedModel``, possibly PEFT-wrapped) when its logits
    are exactly ``last_hidden_state @ layer.weight.T``, else None: the model has no ``get_decoder``, its output
    layer is not exactly a bias-free ``nn.Linear`` (e.g. a LoRA on ``lm_head``) or its config post-processes the
    logits (`LOGIT_POST_PROCESSING`). Its weight may be sharded (a DTensor)."""
    base = unwrap_causal_lm(model)
    get_output = getattr(base, 'get_output_embeddings', None)
    head = get_output() if callable(get_output) else None
    config = getattr(base, 'config', None)
    if not callable(getattr(base, 'get_decoder', None)) or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if any(getattr(config, name, None) for name in LOGIT_POST_PROCESSING):
        return None
    return head


def plain_output_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """``(decoder, output-embedding weight [V, H])`` when ``logits == decoder(...).last_hidden_state @ weight.T``
    exactly (`plain_output_layer`) and the weight is whole (not a DTensor shard, which only the root module's
    forward gathers), else None. Callers then use the model's full logits."""
    head = plain_output_layer(model)
    if head is None or type(head.weight.data).__name__ == 'DTensor':
        return None
    base: Any = unwrap_causal_lm(model)
    return base.get_decoder(), head.weight
