"""The scalar head of a Megatron value / reward model (`MegatronValueModel`), in place of the vocabulary head.

On the last pipeline stage `install` (called by `build.build_chunks` for an architecture with ``value_head``)
replaces the `GPTModel`'s vocabulary-parallel ``output_layer`` by a `ValueHead` registered as ``value_head``
(Hugging Face's ``score``: ``[1, hidden]``, no bias), so its weight converts, saves and loads under its own
name. The head is replicated on every tensor-parallel rank: under sequence parallelism its input is gathered
along the sequence first (the gradient is split back, not summed: every tp rank computes the same values and
loss). Its weight carries ``trained_in_full``: trained beside any LoRA adapter and saved with it (PEFT's
``modules_to_save``; `trained_in_full`, `peft_full_key`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from twinkle_megatron import convert
from twinkle_megatron.architecture import Architecture


class ValueHead(nn.Module):
    """``hidden [s, b, h] -> values [s, b, 1]``, called as Megatron calls its output layer."""

    def __init__(self, hidden_size: int, *, sequence_parallel: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.weight.trained_in_full = True  # type: ignore[attr-defined]
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return nn.functional.linear(hidden, self.weight), None


class _CallHead:
    """What `GPTModel.forward` calls as ``self.output_layer``: the head, not registered a second time."""

    def __init__(self, head: ValueHead) -> None:
        self.head = head
        self.sequence_parallel = head.sequence_parallel

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return self.head(hidden)


def install(model: Any, *, hidden_size: int, sequence_parallel: bool, dtype: torch.dtype) -> None:
    """Replace the vocabulary head of `model` (a `GPTModel` of the last pipeline stage) by a `ValueHead` (zero
    until loaded)."""
    del model.output_layer
    model.value_head = ValueHead(hidden_size, sequence_parallel=sequence_parallel, dtype=dtype)
    object.__setattr__(model, 'output_layer', _CallHead(model.value_head))


def write_config(path: Path) -> None:
    """Turn the copied causal-LM ``config.json`` at `path` into a one-label sequence-classification one (what
    ``AutoModelForSequenceClassification`` and `TransformersValueModel` load a value model's checkpoint as)."""
    config = json.loads(path.read_text())
    config['architectures'] = [
        name.replace('ForCausalLM', 'ForSequenceClassification') for name in config.get('architectures') or []
    ]
    config.update(id2label={'0': 'LABEL_0'}, label2id={'LABEL_0': 0})
    path.write_text(json.dumps(config, indent=2))


def trained_in_full(chunks: list[Any]) -> list[tuple[str, nn.Parameter]]:
    """(Megatron name, parameter) of this rank's weights marked ``trained_in_full`` (a value model's head): they
    train beside an adapter and are saved with it, as PEFT's ``modules_to_save``."""
    return [
        (name, p)
        for chunk in chunks
        for name, p in getattr(chunk, 'module', chunk).named_parameters()  # under its DDP wrapper or not
        if getattr(p, 'trained_in_full', False)
    ]


def peft_full_key(arch: Architecture, name: str) -> str:
    """The key of a weight trained in full (`trained_in_full`) in ``adapter_model.safetensors``."""
    return f'base_model.model.{convert.hf_names(arch, name)[0]}'
