"""Build this rank's Megatron model chunks (one `GPTModel` per virtual pipeline stage) and fill them from a
Hugging Face checkpoint directory, each rank reading only the tensors of its own shard.

The layer spec is megatron-core's local (non-TransformerEngine) one, with PyTorch SDPA as the core attention
(`twinkle_megatron.attention`) and `RMSNorm` below as the norm: it is
torch's RMSNorm (equal to Hugging Face's in fp32) that also marks its weight ``sequence_parallel`` so that
`finalize_model_grads` sums its gradient over the tensor-parallel ranks under sequence parallelism (megatron's
own torch norm refuses sequence parallelism). The TransformerEngine spec is not used yet (docs/megatron.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_megatron import convert, value_head
from twinkle_megatron.architecture import Architecture, Layout, padded_vocab_size, transformer_config_kwargs
from twinkle_megatron.attention import SDPAttention
from twinkle_megatron.cpu_compat import define_missing_te_gemm, tensors_as_cuda


class RMSNorm(torch.nn.RMSNorm):
    """torch RMSNorm with Megatron's norm signature; sequence-parallel aware (see the module docstring)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        if config.sequence_parallel:
            # megatron's flags live as attributes on parameters, which torch's stubs do not declare
            self.weight.sequence_parallel = True  # type: ignore[attr-defined]


def layer_spec(arch: Architecture, num_layers: int) -> Any:
    """The block spec of one chunk of `num_layers` layers."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = specs.get_gpt_layer_local_spec(
        num_experts=arch.num_experts, qk_layernorm=arch.qk_norm, normalization='RMSNorm'
    )
    sub = layer.submodules
    sub.input_layernorm = sub.pre_mlp_layernorm = RMSNorm
    sub.self_attention.submodules.core_attention = SDPAttention
    if arch.qk_norm:
        sub.self_attention.submodules.q_layernorm = sub.self_attention.submodules.k_layernorm = RMSNorm
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=RMSNorm)


def build_chunks(arch: Architecture, layout: Layout, dtype: torch.dtype, device: torch.device) -> list[Any]:
    """This rank's model chunks (uninitialised weights), on `device`."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    if arch.is_moe:
        define_missing_te_gemm()
    config = TransformerConfig(**transformer_config_kwargs(arch, layout, dtype))
    per_chunk = arch.num_layers // (layout.pp * layout.vpp)
    spec = layer_spec(arch, per_chunk)
    chunks = []
    for stage in range(layout.vpp):
        vp = stage if layout.vpp > 1 else None
        with tensors_as_cuda():  # a tied output layer on the last stage is moved with Tensor.cuda()
            chunk = GPTModel(
                config,
                spec,
                vocab_size=padded_vocab_size(arch.vocab_size, layout.tp),
                max_sequence_length=arch.max_position_embeddings,
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=arch.tied_embeddings,
                position_embedding_type='rope',
                rotary_base=int(arch.rope_theta),
                vp_stage=vp,
            )
        if arch.value_head and chunk.post_process:
            value_head.install(chunk, hidden_size=arch.hidden_size, sequence_parallel=layout.sp, dtype=dtype)
        mark_tensor_parallel(chunk)
        chunks.append(chunk.to(device))
    return chunks


def mark_tensor_parallel(chunk: Any) -> None:
    """Set Megatron's tensor-parallel attributes on the sharded weights. Megatron sets them only while it
    initialises weights (``perform_initialization``), which is off here: the checkpoint fills them. The gradient
    norm counts a weight without them once per model-parallel group instead of once per shard."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for name, param in chunk.named_parameters():
        dim = convert.tp_split_dim(name)
        if dim is not None and not hasattr(param, 'tensor_model_parallel'):  # biases have them already
            set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)


def unwrap(chunk: Any) -> Any:
    """The `GPTModel` of a chunk, under its DDP wrapper or not."""
    return getattr(chunk, 'module', chunk)


def global_name(chunk: Any, local_name: str) -> str:
    """`local_name` with a chunk-local layer index replaced by the global one (``decoder.layers.{i}``)."""
    if not local_name.startswith('decoder.layers.'):
        return local_name
    index, rest = local_name[len('decoder.layers.') :].split('.', 1)
    layer = unwrap(chunk).decoder.layers[int(index)]
    return f'decoder.layers.{layer.layer_number - 1}.{rest}'


_LOCAL_EXPERT = re.compile(r'(\.experts\.local_experts\.)(\d+)\.')


def base_parameters(chunk: Any, expert_offset: int = 0) -> dict[str, torch.Tensor]:
    """Global Megatron name -> tensor of the chunk's base weights (LoRA factors and buffers excluded): layer
    indices over the whole model, expert indices shifted by `expert_offset` (this rank's first expert)."""
    out = {}
    chunk = unwrap(chunk)
    for name, tensor in chunk.state_dict(keep_vars=True).items():
        if name.endswith('_extra_state') or '.lora_' in name or 'rotary_pos_emb' in name:
            continue
        name = _LOCAL_EXPERT.sub(lambda m: f'{m.group(1)}{int(m.group(2)) + expert_offset}.', name)
        out[global_name(chunk, name.replace('.base_layer.', '.'))] = tensor
    return out


class HFTensorReader:
    """Name -> tensor over a checkpoint's safetensors files (read lazily, one tensor at a time); ``name in reader``
    says whether the checkpoint holds it."""

    def __init__(self, model_dir: str | Path) -> None:
        from safetensors import safe_open

        self.root = root = Path(model_dir)
        index = root / 'model.safetensors.index.json'
        if index.exists():
            self.where = {k: root / f for k, f in json.loads(index.read_text())['weight_map'].items()}
        else:
            files = sorted(root.glob('*.safetensors'))
            if not files:
                raise InvalidInputError(
                    f'{root} has no *.safetensors weights; MegatronModel loads safetensors '
                    f'checkpoints (save the model with save_pretrained(safe_serialization=True)).'
                )
            self.where = {}
            for f in files:
                with safe_open(f, framework='pt') as handle:
                    self.where.update({k: f for k in handle.keys()})
        self.handles: dict[Path, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def __call__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.where:
            raise InvalidInputError(f'{self.root} has no tensor {name!r} (expected for this architecture).')
        f = self.where[name]
        if f not in self.handles:
            self.handles[f] = safe_open(f, framework='pt')
        return self.handles[f].get_tensor(name)


@torch.no_grad()
def load_hf_weights(
    chunks: list[Any],
    arch: Architecture,
    read: Callable[[str], torch.Tensor],
    *,
    tp: int,
    tp_rank: int,
    expert_offset: int = 0,
) -> None:
    """Fill every base weight of `chunks` with this rank's shard of the HF tensors `read` returns."""
    padded = padded_vocab_size(arch.vocab_size, tp)
    for chunk in chunks:
        for name, param in base_parameters(chunk, expert_offset).items():
            value = convert.to_megatron(arch, name, read, tp=tp, tp_rank=tp_rank, padded_vocab=padded)
            if tuple(value.shape) != tuple(param.shape):
                raise InvalidInputError(
                    f'{name}: the checkpoint gives shape {tuple(value.shape)}, the Megatron '
                    f'model expects {tuple(param.shape)} (config and weights disagree).'
                )
            param.copy_(value)


def decoder_layers(chunks: list[Any]) -> list[tuple[int, Any]]:
    """``(global layer index, transformer layer)`` of every layer this rank holds, over all its model chunks: what
    regional compilation and activation checkpointing apply to."""
    return [(layer.layer_number - 1, layer) for chunk in chunks for layer in unwrap(chunk).decoder.layers]
