"""Helpers shared by the multi-LoRA tests (no tests here): rows from text, peft reference models, a reference loss."""

from __future__ import annotations

import copy
from typing import Any

import torch


def text_rows(tokenizer: Any, texts: list[str], prompt_tokens: int = 3) -> list[dict[str, Any]]:
    """Rows with loss on everything after the first `prompt_tokens` tokens."""
    rows = []
    for text in texts:
        ids = tokenizer(text)['input_ids']
        labels = [-100] * prompt_tokens + ids[prompt_tokens:]
        rows.append({'input_ids': ids, 'labels': labels})
    return rows


def random_peft_model(base: torch.nn.Module, config: dict[str, Any], seed: int) -> Any:
    """A peft model on a private copy of `base` whose LoRA A and B are both random (so gradients of A and B
    are non-zero and the adapter changes the logits)."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(**config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if 'lora_' in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return peft_model


def peft_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """LoRA weights of a peft model in saved-file key format (adapter name removed)."""
    return {k.replace('.default', ''): v.detach().clone() for k, v in peft_model.state_dict().items() if 'lora_' in k}


def peft_grads(peft_model: Any) -> dict[str, torch.Tensor]:
    return {n.replace('.default', ''): p.grad for n, p in peft_model.named_parameters() if 'lora_' in n}


def reference_loss(model: Any, rows: list[dict[str, Any]], reduction: str = 'token_mean') -> tuple[torch.Tensor, Any]:
    """Cross-entropy of `rows` under `model`, computed independently of twinkle (right padding, HF shift)."""
    width = max(len(r['input_ids']) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r['input_ids'])
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(r['input_ids']), torch.tensor(r['labels']), 1
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    targets = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction='sum'
    )
    if reduction == 'token_mean':
        loss = loss / (targets != -100).sum()
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return loss, [[0.0] + logps[i, : len(r['input_ids']) - 1].tolist() for i, r in enumerate(rows)]
