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

Several named adapters live side by side: a wrapped linear holds each adapter's `AdapterFactors` and adds the
`active` one's update; which adapter is active and which train is `twinkle_megatron.adapter_scope`.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterator, cast

import torch
from torch import nn

from twinkle_core.errors import InvalidInputError
from twinkle_megatron import value_head
from twinkle_megatron.architecture import Architecture, padded_vocab_size
from twinkle_megatron.build import unwrap

#: Megatron linear (suffix in a layer) -> (kind, its Hugging Face projections in output order)
TARGETS = {
    'self_attention.linear_qkv': ('column', ('q_proj', 'k_proj', 'v_proj')),
    'self_attention.linear_proj': ('row', ('o_proj',)),
    'mlp.linear_fc1': ('column', ('gate_proj', 'up_proj')),
    'mlp.linear_fc2': ('row', ('down_proj',)),
}
HF_MODULE = {
    'q_proj': 'self_attn',
    'k_proj': 'self_attn',
    'v_proj': 'self_attn',
    'o_proj': 'self_attn',
    'gate_proj': 'mlp',
    'up_proj': 'mlp',
    'down_proj': 'mlp',
}
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
        raise InvalidInputError(
            f'MegatronModel adapts the decoder projections {", ".join(ALL_LINEAR)} (or '
            f'"all-linear") and {OUTPUT}; target_modules also names {unknown}.'
        )
    return tuple(p for p in KNOWN if p in {n.rsplit('.', 1)[-1] for n in names})


def part_rows(arch: Architecture, projection: str, tp: int = 1) -> tuple[int, int]:
    """(out features, in features) of a Hugging Face projection (the output layer's rows: the vocabulary
    padded for `tp` ranks)."""
    h, d = arch.hidden_size, arch.head_dim
    if projection == OUTPUT:
        return padded_vocab_size(arch.vocab_size, tp), h
    return {
        'q_proj': (arch.num_heads * d, h),
        'k_proj': (arch.num_kv_heads * d, h),
        'v_proj': (arch.num_kv_heads * d, h),
        'o_proj': (h, arch.num_heads * d),
        'gate_proj': (arch.ffn_hidden_size, h),
        'up_proj': (arch.ffn_hidden_size, h),
        'down_proj': (h, arch.ffn_hidden_size),
    }[projection]


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f'{seed}:{name}'.encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], 'little') & ((1 << 63) - 1))


def check_adapter_name(adapter: Any) -> str:
    """An adapter name is a non-empty string without dots (it names a submodule of every adapted layer)."""
    if not isinstance(adapter, str) or not adapter or '.' in adapter:
        raise InvalidInputError(f'Adapter name {adapter!r}: use a non-empty string without dots.')
    return adapter


class AdapterFactors(nn.Module):
    """One adapter's LoRA factors on one Megatron linear: per adapted HF projection ``lora_A[part]`` and
    ``lora_B[part]``, sharded over tp like the base layer (see the module docstring)."""

    def __init__(
        self,
        *,
        kind: str,
        parts: tuple[str, ...],
        arch: Architecture,
        r: int,
        scaling: float,
        dropout: float,
        tp: int,
        tp_rank: int,
        sequence_parallel: bool,
        seed: int,
        name: str,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        self.parts, self.scaling = parts, scaling
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
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
                self.lora_A[part].sequence_parallel = True


class LoraParallelLinear(nn.Module):
    """A Megatron parallel linear plus named adapters (`AdapterFactors` each, one LoRA per fused HF projection);
    the forward adds the `active` adapter's update (none: the base layer alone).

    `layer_parts`: the HF projections the layer fuses, in output order. `like`: a tensor of the factors' dtype
    and device (default: the base weight; a tied output layer has no weight of its own)."""

    def __init__(
        self,
        base: nn.Module,
        *,
        kind: str,
        layer_parts: tuple[str, ...],
        arch: Architecture,
        tp: int,
        sequence_parallel: bool,
        like: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.base_layer = base
        self.kind, self.layer_parts, self.arch = kind, layer_parts, arch
        self.tp, self.sequence_parallel = tp, sequence_parallel
        ref = base.weight if like is None else like
        assert isinstance(ref, torch.Tensor), 'a base layer without a weight (tied output layer) needs `like`'
        self.factor_dtype, self.factor_device = ref.dtype, ref.device  # not the tensor: it would register
        self.adapters = nn.ModuleDict()  # adapter name -> AdapterFactors (read through `factors_of`)
        self.active: str | None = None

    @property
    def weight(self) -> torch.Tensor | None:  # megatron reads ``linear.weight`` (dtype, device, clipping)
        # a Megatron linear's weight: a Parameter, None for a tied output layer (megatron-core is untyped)
        return cast(torch.Tensor | None, self.base_layer.weight)

    def factors_of(self, adapter: str) -> AdapterFactors:
        """Adapter `adapter`'s factors on this linear (KeyError if it has none)."""
        return cast(AdapterFactors, self.adapters[adapter])  # `adapters` holds AdapterFactors only (add_lora)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        out, bias = self.base_layer(x, *args, **kwargs)
        factors = self.factors_of(self.active) if self.active is not None and self.active in self.adapters else None
        if factors is None:
            return out, bias
        delta = self._column(x, factors) if self.kind == 'column' else self._row(x, factors)
        return out + delta.to(out.dtype), bias

    def _column(self, x: torch.Tensor, f: AdapterFactors) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings

        if self.sequence_parallel:
            x = mappings.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=True)
        x = f.dropout(x)
        outputs = {}
        for part in f.parts:
            h = x @ f.lora_A[part].T
            if not self.sequence_parallel:
                h = mappings.copy_to_tensor_model_parallel_region(h)
            outputs[part] = (h @ f.lora_B[part].T) * f.scaling
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

    def _row(self, x: torch.Tensor, f: AdapterFactors) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings

        (part,) = f.parts
        h = mappings.reduce_from_tensor_model_parallel_region(f.dropout(x) @ f.lora_A[part].T)
        y = (h @ f.lora_B[part].T) * f.scaling
        return mappings.scatter_to_sequence_parallel_region(y) if self.sequence_parallel else y


def _targets(chunk: Any) -> Iterator[tuple[nn.Module, str, str, str, tuple[str, ...]]]:
    """(parent module, attribute, global name, kind, HF parts) of every adaptable linear of a chunk: the dense
    layers' four projections (an MoE layer's experts are not LoRA targets) and the output layer."""
    model = unwrap(chunk)
    for layer in model.decoder.layers:
        for suffix, (kind, layer_parts) in TARGETS.items():
            parent_name, attr = suffix.split('.')
            parent = getattr(layer, parent_name)
            if getattr(parent, attr, None) is not None:
                yield parent, attr, f'decoder.layers.{layer.layer_number - 1}.{suffix}', kind, layer_parts
    if getattr(model, 'output_layer', None) is not None:
        yield model, 'output_layer', 'output_layer', 'column', (OUTPUT,)


def add_lora(
    chunks: list[Any],
    arch: Architecture,
    config: Any,
    *,
    adapter: str,
    tp: int,
    tp_rank: int,
    sequence_parallel: bool,
    seed: int,
) -> int:
    """Add adapter `adapter` (`config`: a `peft.LoraConfig`) to the targeted linears of `chunks` (wrapping them in
    `LoraParallelLinear` where needed) and freeze the base model; returns how many linears it adapts."""
    check_adapter_name(adapter)
    projections = target_projections(config.target_modules)
    r = int(config.r)
    scaling = config.lora_alpha / (math.sqrt(r) if config.use_rslora else r)
    count = 0
    for chunk in chunks:
        for param_name, p in chunk.named_parameters():  # the base frozen; adapters' factors trainable at rest
            p.requires_grad_('.adapters.' in param_name or getattr(p, 'trained_in_full', False))
        for parent, attr, name, kind, layer_parts in list(_targets(chunk)):
            parts = tuple(p for p in layer_parts if p in projections)
            if not parts:
                continue
            module = getattr(parent, attr)
            if not isinstance(module, LoraParallelLinear):
                like = next(unwrap(chunk).decoder.parameters()) if attr == 'output_layer' else None
                module = LoraParallelLinear(
                    module,
                    kind=kind,
                    layer_parts=layer_parts,
                    arch=arch,
                    tp=tp,
                    sequence_parallel=sequence_parallel,
                    like=like,
                )
                setattr(parent, attr, module)
            module.adapters[adapter] = AdapterFactors(
                kind=kind,
                parts=parts,
                arch=arch,
                r=r,
                scaling=scaling,
                dropout=float(config.lora_dropout),
                tp=tp,
                tp_rank=tp_rank,
                sequence_parallel=sequence_parallel,
                seed=seed,
                name=name,
                dtype=module.factor_dtype,
                device=module.factor_device,
            )
            count += 1
    return count


def remove_lora(chunks: list[Any], adapter: str) -> bool:
    """Drop adapter `adapter`'s factors; a linear left with no adapter gets its base layer back. Returns whether
    any adapter remains (if none does, every parameter is trainable again, as before `add_lora`)."""
    for parent, attr, _, _, _ in list(_targets_wrapped(chunks)):
        module = getattr(parent, attr)
        if adapter in module.adapters:
            del module.adapters[adapter]
        if not len(module.adapters):
            setattr(parent, attr, module.base_layer)
    if lora_modules(chunks):
        return True
    for chunk in chunks:
        chunk.requires_grad_(True)
    return False


def _targets_wrapped(chunks: list[Any]) -> Iterator[tuple[nn.Module, str, str, str, tuple[str, ...]]]:
    for chunk in chunks:
        for target in _targets(chunk):
            if isinstance(getattr(target[0], target[1]), LoraParallelLinear):
                yield target


def lora_modules(chunks: list[Any]) -> dict[str, LoraParallelLinear]:
    """Global Megatron layer-linear name -> its LoRA wrapper, over all chunks."""
    return {name: getattr(parent, attr) for parent, attr, name, _, _ in _targets_wrapped(chunks)}


def adapter_parameters(chunks: list[Any], adapter: str) -> list[nn.Parameter]:
    """Adapter `adapter`'s factors on this rank, and the weights trained in full beside it (a value model's head)."""
    factors = [
        p
        for module in lora_modules(chunks).values()
        if adapter in module.adapters
        for p in module.adapters[adapter].parameters()
    ]
    return factors + [p for _, p in value_head.trained_in_full(chunks)]


def peft_key(layer: int | None, part: str, factor: str) -> str:
    """The key of a LoRA factor in ``adapter_model.safetensors`` (PEFT's saved naming)."""
    if part == OUTPUT:
        return f'base_model.model.{OUTPUT}.lora_{factor}.weight'
    return f'base_model.model.model.layers.{layer}.{HF_MODULE[part]}.{part}.lora_{factor}.weight'


def factors(chunks: list[Any], adapter: str) -> Iterator[tuple[str, nn.Parameter, int | None, str]]:
    """Adapter `adapter`'s factors on this rank: (PEFT key, parameter, the dim it is split over tp or None,
    projection)."""
    for name, module in lora_modules(chunks).items():
        if adapter not in module.adapters:
            continue
        f = module.factors_of(adapter)
        layer = int(name.split('.')[2]) if name.startswith('decoder.layers.') else None
        for part in f.parts:
            a_dim, b_dim = (1, None) if module.kind == 'row' else (None, 0)
            yield peft_key(layer, part, 'A'), f.lora_A[part], a_dim, part
            yield peft_key(layer, part, 'B'), f.lora_B[part], b_dim, part


def lora_config(config: Any, **overrides: Any) -> Any:
    """`config` (a `peft.LoraConfig`, a dict of its fields or None) plus `overrides` -> a causal-LM `LoraConfig`
    (``target_modules`` default ``'all-linear'``). Unknown fields raise `InvalidInputError`."""
    from peft import LoraConfig

    fields = (config.to_dict() if isinstance(config, LoraConfig) else dict(config or {})) | overrides
    fields.setdefault('target_modules', 'all-linear')
    fields.setdefault('task_type', 'CAUSAL_LM')
    fields.pop('peft_type', None)
    unknown = sorted(set(fields) - set(LoraConfig.__dataclass_fields__))
    if unknown:
        raise InvalidInputError(f'Unknown LoRA config fields {unknown}; see peft.LoraConfig for the valid ones.')
    if fields.get('bias', 'none') != 'none':
        raise InvalidInputError('MegatronModel LoRA trains no biases: use bias="none".')
    config = LoraConfig(**fields)
    target_projections(config.target_modules)  # validates
    return config
