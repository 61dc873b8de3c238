"""Tensor-parallel LoRA for Megatron's `ColumnParallelLinear` / `RowParallelLinear`, in PEFT's terms.

megatron-core has no LoRA. Each adapted Megatron linear keeps one LoRA per *Hugging Face* projection it fuses, so
an adapter is exactly a PEFT adapter and loads, saves and merges as one:

- column-parallel (``linear_qkv`` = q/k/v, ``linear_fc1`` = gate/up): per part, ``A`` ``[r, in]`` replicated and
  ``B`` ``[out_part / tp, r]`` sharded like the base rows; the parts' outputs are laid out as the base layer's
  (q/k/v interleaved per key/value group, gate then up). Without sequence parallelism ``A x`` enters the tp
  region through `copy_to_tensor_model_parallel_region` (its gradient is summed over tp); with it, ``x`` is
  gathered along the sequence and ``A``'s gradient, partial per rank, is marked ``sequence_parallel`` so that
  `finalize_model_grads` sums it.
- row-parallel (``linear_proj`` = o_proj, ``linear_fc2`` = down_proj): ``A`` ``[r, in / tp]`` sharded like the
  base columns, ``B`` ``[out, r]`` replicated; ``A x`` is all-reduced over tp, and under sequence parallelism
  the LoRA output is scattered along the sequence like the base output.

Initialisation is PEFT's (A Kaiming-uniform, B zero), drawn on the full tensors from a generator seeded by the
adapter seed and the module name, then sharded: the same adapter whatever the layout.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Iterator

import torch
from torch import nn

from twinkle_core.errors import InvalidInputError
from twinkle_megatron.architecture import Architecture, padded_vocab_size
from twinkle_megatron.build import unwrap

#: Megatron linear (suffix in a layer) -> (kind, its Hugging Face projections in output order)
TARGETS = {
    'self_attention.linear_qkv': ('column', ('q_proj', 'k_proj', 'v_proj')),
    'self_attention.linear_proj': ('row', ('o_proj',)),
    'mlp.linear_fc1': ('column', ('gate_proj', 'up_proj')),
    'mlp.linear_fc2': ('row', ('down_proj',)),
}
HF_MODULE = {'q_proj': 'self_attn', 'k_proj': 'self_attn', 'v_proj': 'self_attn', 'o_proj': 'self_attn',
             'gate_proj': 'mlp', 'up_proj': 'mlp', 'down_proj': 'mlp'}
ALL_LINEAR = tuple(HF_MODULE)  # PEFT's 'all-linear': every decoder projection, not the output layer
OUTPUT = 'lm_head'  # the output layer (vocabulary-parallel), adapted only when named
KNOWN = ALL_LINEAR + (OUTPUT,)


def target_projections(target_modules: Any) -> tuple[str, ...]:
    """The HF projections a ``target_modules`` value adapts ('all-linear', a name, or a list of names)."""
    if target_modules in (None, 'all-linear'):
        return ALL_LINEAR
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    unknown = sorted({n.rsplit('.', 1)[-1] for n in names} - set(KNOWN))
    if unknown:
        raise InvalidInputError(f'MegatronModel adapts the decoder projections {", ".join(ALL_LINEAR)} (or '
                                f'"all-linear") and {OUTPUT}; target_modules also names {unknown}.')
    return tuple(p for p in KNOWN if p in {n.rsplit('.', 1)[-1] for n in names})


def part_rows(arch: Architecture, projection: str, tp: int = 1) -> tuple[int, int]:
    """(out features, in features) of a Hugging Face projection (the output layer's rows: the vocabulary
    padded for `tp` ranks)."""
    h, d = arch.hidden_size, arch.head_dim
    if projection == OUTPUT:
        return padded_vocab_size(arch.vocab_size, tp), h
    return {'q_proj': (arch.num_heads * d, h), 'k_proj': (arch.num_kv_heads * d, h),
            'v_proj': (arch.num_kv_heads * d, h), 'o_proj': (h, arch.num_heads * d),
            'gate_proj': (arch.ffn_hidden_size, h), 'up_proj': (arch.ffn_hidden_size, h),
            'down_proj': (h, arch.ffn_hidden_size)}[projection]


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f'{seed}:{name}'.encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], 'little') & ((1 << 63) - 1))


class LoraParallelLinear(nn.Module):
    """A Megatron parallel linear plus one LoRA per fused HF projection (see the module docstring).

    `parts`: the adapted projections (a subset of the layer's, in output order). `name`: the layer's global
    Megatron name (seeds the initialisation). `like`: a tensor of the factors' dtype and device (default: the
    base weight)."""

    def __init__(self, base: nn.Module, *, kind: str, layer_parts: tuple[str, ...], parts: tuple[str, ...],
                 arch: Architecture, r: int, scaling: float, dropout: float, tp: int, tp_rank: int,
                 sequence_parallel: bool, seed: int, name: str, like: torch.Tensor | None = None) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
        self.base_layer = base
        self.kind, self.layer_parts, self.parts, self.arch = kind, layer_parts, parts, arch
        self.scaling, self.tp, self.sequence_parallel = scaling, tp, sequence_parallel
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        like = base.weight if like is None else like  # a tied output layer has no weight of its own
        dtype, device = like.dtype, like.device
        for part in parts:
            out_f, in_f = part_rows(arch, part, tp)
            a = torch.empty(r, in_f)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=_generator(seed, f'{name}.{part}'))
            b = torch.zeros(out_f, r)
            if kind == 'row':
                a = a.chunk(tp, dim=1)[tp_rank]
            else:
                b = b.chunk(tp, dim=0)[tp_rank]
            self.lora_A[part] = nn.Parameter(a.to(device=device, dtype=dtype).contiguous())
            self.lora_B[part] = nn.Parameter(b.to(device=device, dtype=dtype).contiguous())
            sharded = self.lora_A[part] if kind == 'row' else self.lora_B[part]
            set_tensor_model_parallel_attributes(sharded, is_parallel=True, dim=1 if kind == 'row' else 0, stride=1)
            if kind == 'column' and sequence_parallel:  # partial per rank; finalize_model_grads sums it over tp
                setattr(self.lora_A[part], 'sequence_parallel', True)

    @property
    def weight(self) -> torch.Tensor:  # megatron reads ``linear.weight`` (dtype, device, clipping)
        return self.base_layer.weight

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        out, bias = self.base_layer(x, *args, **kwargs)
        delta = self._column(x) if self.kind == 'column' else self._row(x)
        return out + delta.to(out.dtype), bias

    def _column(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings
        if self.sequence_parallel:
            x = mappings.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=True)
        x = self.dropout(x)
        outputs = {}
        for part in self.parts:
            h = x @ self.lora_A[part].T
            if not self.sequence_parallel:
                h = mappings.copy_to_tensor_model_parallel_region(h)
            outputs[part] = (h @ self.lora_B[part].T) * self.scaling
        return self._layout(outputs, x.shape[:-1], x)

    def _layout(self, outputs: dict[str, torch.Tensor], lead: torch.Size, x: torch.Tensor) -> torch.Tensor:
        """The parts' local outputs in the base layer's row order (absent parts contribute zeros)."""
        pieces = []
        for part in self.layer_parts:
            rows = part_rows(self.arch, part, self.tp)[0] // self.tp
            pieces.append(outputs[part] if part in outputs else x.new_zeros(*lead, rows))
        if self.layer_parts[0] != 'q_proj':
            return torch.cat(pieces, dim=-1)
        groups = self.arch.num_kv_heads // self.tp  # q/k/v interleaved per key/value group
        return torch.cat([p.reshape(*lead, groups, -1) for p in pieces], dim=-1).reshape(*lead, -1)

    def _row(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings
        (part,) = self.parts
        h = mappings.reduce_from_tensor_model_parallel_region(self.dropout(x) @ self.lora_A[part].T)
        y = (h @ self.lora_B[part].T) * self.scaling
        return mappings.scatter_to_sequence_parallel_region(y) if self.sequence_parallel else y


def add_lora(chunks: list[Any], arch: Architecture, config: Any, *, tp: int, tp_rank: int,
             sequence_parallel: bool, seed: int) -> int:
    """Replace the targeted linears of every layer of `chunks` by `LoraParallelLinear` and freeze everything
    else; returns how many linears were adapted. `config`: a `peft.LoraConfig`."""
    projections = target_projections(config.target_modules)
    r = int(config.r)
    scaling = config.lora_alpha / (math.sqrt(r) if config.use_rslora else r)
    count = 0
    for chunk in chunks:
        for p in chunk.parameters():
            p.requires_grad_(False)
        for layer in unwrap(chunk).decoder.layers:
            for suffix, (kind, layer_parts) in TARGETS.items():
                parts = tuple(p for p in layer_parts if p in projections)
                if not parts:
                    continue
                parent_name, attr = suffix.split('.')
                parent = getattr(layer, parent_name)
                if getattr(parent, attr, None) is None:  # an MoE layer's MLP: experts are not LoRA targets
                    continue
                name = f'decoder.layers.{layer.layer_number - 1}.{suffix}'
                setattr(parent, attr, LoraParallelLinear(
                    getattr(parent, attr), kind=kind, layer_parts=layer_parts, parts=parts, arch=arch, r=r,
                    scaling=scaling, dropout=float(config.lora_dropout), tp=tp, tp_rank=tp_rank,
                    sequence_parallel=sequence_parallel, seed=seed, name=name))
                count += 1
        model = unwrap(chunk)
        if OUTPUT in projections and getattr(model, 'output_layer', None) is not None:
            model.output_layer = LoraParallelLinear(
                model.output_layer, kind='column', layer_parts=(OUTPUT,), parts=(OUTPUT,), arch=arch, r=r,
                scaling=scaling, dropout=float(config.lora_dropout), tp=tp, tp_rank=tp_rank,
                sequence_parallel=sequence_parallel, seed=seed, name='output_layer',
                like=next(model.decoder.parameters()))
            count += 1
    return count


def remove_lora(chunks: list[Any]) -> None:
    """Put the base linears back and make every parameter trainable again (undoes `add_lora`)."""
    for chunk in chunks:
        for layer in unwrap(chunk).decoder.layers:
            for suffix in TARGETS:
                parent_name, attr = suffix.split('.')
                parent = getattr(layer, parent_name)
                module = getattr(parent, attr, None)
                if isinstance(module, LoraParallelLinear):
                    setattr(parent, attr, module.base_layer)
        model = unwrap(chunk)
        if isinstance(getattr(model, 'output_layer', None), LoraParallelLinear):
            model.output_layer = model.output_layer.base_layer
        chunk.requires_grad_(True)


def lora_modules(chunks: list[Any]) -> dict[str, LoraParallelLinear]:
    """Global Megatron layer-linear name -> its LoRA wrapper, over all chunks."""
    out = {}
    for chunk in chunks:
        for layer in unwrap(chunk).decoder.layers:
            for suffix in TARGETS:
                parent_name, attr = suffix.split('.')
                module = getattr(getattr(layer, parent_name), attr, None)
                if isinstance(module, LoraParallelLinear):
                    out[f'decoder.layers.{layer.layer_number - 1}.{suffix}'] = module
        if isinstance(getattr(unwrap(chunk), 'output_layer', None), LoraParallelLinear):
            out['output_layer'] = unwrap(chunk).output_layer
    return out


def peft_key(layer: int | None, part: str, factor: str) -> str:
    """The key of a LoRA factor in ``adapter_model.safetensors`` (PEFT's saved naming)."""
    if part == OUTPUT:
        return f'base_model.model.{OUTPUT}.lora_{factor}.weight'
    return f'base_model.model.model.layers.{layer}.{HF_MODULE[part]}.{part}.lora_{factor}.weight'


def factors(chunks: list[Any]) -> Iterator[tuple[str, nn.Parameter, int | None, str]]:
    """Every LoRA factor of this rank: (PEFT key, parameter, the dim it is split over tp or None, projection)."""
    for name, module in lora_modules(chunks).items():
        layer = int(name.split('.')[2]) if name.startswith('decoder.layers.') else None
        for part in module.parts:
            a_dim, b_dim = (1, None) if module.kind == 'row' else (None, 0)
            yield peft_key(layer, part, 'A'), module.lora_A[part], a_dim, part
            yield peft_key(layer, part, 'B'), module.lora_B[part], b_dim, part
