"""Merged-weight export: a LoRA checkpoint folded into its base model, written as a plain Hugging Face model
directory that transformers, vLLM or any other runtime loads without peft.

Any LoRA checkpoint in PEFT's file format merges: `TransformersModel` / `MultiLoraTransformersModel` /
`MegatronModel` saves, a sharded (DCP) save (exported to PEFT format first), a downloaded service checkpoint. A
full-weights checkpoint has nothing to merge and is exported as it is (`export_checkpoint`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.train import checkpoint_dir as ckpt
from twinkle_transformers.sharded_checkpoint import export_checkpoint, is_sharded_checkpoint

DTYPES = ('float32', 'bfloat16', 'float16')
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja')


def export_merged(
    checkpoint: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
    dtype: str = 'float32',
    max_shard_size: str = '2GB',
) -> str:
    """Write `checkpoint` with its LoRA merged into the base model (`base`, else the adapter's
    ``base_model_name_or_path``) at `output_dir`, in `dtype`, with the tokenizer (the checkpoint's, else the
    base's); returns `output_dir`. Written atomically: an existing `output_dir` is replaced only on success."""
    if dtype not in DTYPES:
        raise InvalidInputError(f'export: dtype {dtype!r} is not one of {", ".join(DTYPES)}.')
    source = Path(checkpoint)
    meta = ckpt.read_metadata(source)
    if meta.get('kind') != 'lora':
        return export_checkpoint(source, output_dir)
    with tempfile.TemporaryDirectory(prefix='twinkle-merge-') as scratch:
        if is_sharded_checkpoint(meta):
            source = Path(export_checkpoint(source, Path(scratch) / 'adapter'))
        base_dir = _base_of(source, base)
        _merge(source, base_dir, Path(output_dir), dtype, max_shard_size)
    return str(output_dir)


def _base_of(adapter: Path, base: str | os.PathLike[str] | None) -> Path:
    config = json.loads((adapter / 'adapter_config.json').read_text())
    named = base or config.get('base_model_name_or_path')
    if not named:
        raise InvalidInputError(
            f'{str(adapter)!r} does not name its base model (adapter_config.json has no base_model_name_or_path); '
            'give it with --base DIR.'
        )
    path = Path(named)
    if not (path / 'config.json').is_file():
        hint = '' if base else ' (from adapter_config.json)'
        raise InvalidInputError(
            f'base model {str(named)!r}{hint} is not a local Hugging Face model directory (no config.json there); '
            'give the base model directory with --base DIR.'
        )
    return path


def _untie_an_adapted_output_embedding(model: Any) -> None:
    """A LoRA on the output embedding of a model whose input and output embeddings are one tensor (tied, as in
    Qwen3 and SmolLM2; Tinker trains the unembedding by default) must change the output side only: give the output
    layer its own copy of the weight before merging, and say so in the config, or the merge would move the input
    embedding too."""
    import torch

    output = model.get_output_embeddings()
    base_layer = getattr(output, 'base_layer', None)  # a LoRA-wrapped output layer
    if base_layer is None or base_layer.weight is not model.get_input_embeddings().weight:
        return
    base_layer.weight = torch.nn.Parameter(base_layer.weight.detach().clone(), requires_grad=False)
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = False


def _merge(adapter: Path, base_dir: Path, output_dir: Path, dtype: str, max_shard_size: str) -> None:
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=getattr(torch, dtype))
    wrapped = peft.PeftModel.from_pretrained(model, adapter)
    _untie_an_adapted_output_embedding(model)
    merged = wrapped.merge_and_unload()
    tokenizer_source = adapter if any((adapter / name).exists() for name in TOKENIZER_FILES) else base_dir
    with ckpt.atomic_directory(output_dir) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(tmp)
        generation = base_dir / 'generation_config.json'
        if generation.exists() and not (tmp / generation.name).exists():
            shutil.copyfile(generation, tmp / generation.name)
