"""`MegatronModel`'s checkpoints and weight export (the model half of the backend seam): `MegatronPersistence`,
a collaborator the model holds (``model.persistence``) and delegates its `save` / `load` / export methods to.

Both are collective over the model's ranks (weights are gathered over tp and pp to global rank 0); see
`twinkle_megatron.checkpoint` for the directory layout and `twinkle_megatron.export` for the streaming.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import torch.distributed as dist

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.checkpoint_dir import (
    load_training_state,
    read_metadata,
    restore_run_state,
    save_training_state,
    write_metadata,
)
from twinkle_core.weight_sync.weights import Bucket, bucketed
from twinkle_megatron import build, export
from twinkle_megatron import checkpoint as ckpt
from twinkle_megatron.lora import part_rows

if TYPE_CHECKING:
    from twinkle_megatron.architecture import Architecture, Layout
    from twinkle_megatron.units import TrainingUnit

__all__ = ['MegatronPersistence', 'PersistedModel']


class PersistedModel(Protocol):
    """What `MegatronPersistence` reads of its model (`MegatronModel`): its chunks and architecture, and its
    training units."""

    chunks: list[Any]  # this rank's model chunks (one per virtual pipeline stage)
    arch: Architecture
    layout: Layout
    ranks: dict[str, int]  # this process's rank along each parallel axis
    dtype: Any
    model_id: str
    model_dir: str
    units: dict[str, TrainingUnit]

    def expert_offset(self) -> int:
        """The global index of this rank's first local expert (0 for a dense model)."""
        ...

    def layout_json(self) -> dict[str, Any]:
        """The parallel layout as checkpoint metadata records it."""
        ...

    def unit_for(self, adapter_name: str | None) -> TrainingUnit:
        """The training unit a call addresses (None: the only adapter, or full-parameter training)."""
        ...

    def list_adapters(self) -> list[str]: ...

    def add_adapter_to_model(self, adapter_name: str, config: Any, **kwargs: Any) -> None: ...


class MegatronPersistence:
    """Saving, loading and exporting the weights of `model`. It reads the model's chunks and architecture
    (`chunks`, `arch`, `layout`, `ranks`, `dtype`, `model_id`, `model_dir`, `expert_offset()`, `layout_json()`)
    and its training units (`units`, `unit_for(name)`, `list_adapters()`; `add_adapter_to_model()` for a checkpoint of
    an adapter it lacks). The model's own methods of the same names report failures (`reports_failure`) and call
    these."""

    def __init__(self, model: PersistedModel) -> None:
        self.model = model

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def save(
        self,
        name: str,
        *,
        output_dir: str | None = None,
        save_optimizer: bool = False,
        adapter_name: str | None = None,
        dataloader: Any = None,
        extra_state: Any = None,
        **kwargs: Any,
    ) -> str:
        """Write checkpoint `name` under `output_dir` (default ``./output``); returns its directory. LoRA in PEFT
        format, full weights in Hugging Face format; ``save_optimizer=True`` adds everything an exact resume
        needs (optimizer shards per model-parallel rank, scheduler, counters, RNG, `dataloader`, `extra_state`)."""
        m = self.model
        unit = m.unit_for(adapter_name)
        state = unit.state
        target = Path(output_dir or 'output') / name
        with ckpt.collective_directory(target) as tmp:
            if unit.adapter is not None:
                ckpt.save_lora(m.chunks, m.arch, unit.lora_config, tmp, adapter=unit.adapter, base_model_id=m.model_id)
            else:
                ckpt.save_full(m.chunks, m.arch, tmp, source_dir=m.model_dir, expert_offset=m.expert_offset())
            if save_optimizer:
                ckpt.save_optimizer(state, tmp)
            if dist.get_rank() == 0:
                write_metadata(
                    tmp,
                    kind='lora' if unit.adapter else 'full',
                    adapter_name=unit.adapter,
                    model_id=m.model_id,
                    step=state.optimizer_steps,
                    backend='megatron',
                    layout=m.layout_json(),
                    has_training_state=save_optimizer,
                )
                if save_optimizer:
                    save_training_state(tmp, state.state_dict(), dataloader=dataloader, extra_state=extra_state)
        return str(target)

    def load(
        self,
        path: str,
        *,
        load_optimizer: bool = False,
        adapter_name: str | None = None,
        dataloader: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Load a checkpoint written by `save` (by this or any other backend), a PEFT adapter directory or a
        Hugging Face model directory. A LoRA checkpoint loads into adapter `adapter_name` (default: the model's
        only adapter, else the saved name or ``'default'``), which is added first when the model lacks it.
        ``load_optimizer=True`` restores the training state (same tp/pp layout) and returns ``extra_state``."""
        m = self.model
        meta = read_metadata(path)
        adapters = m.list_adapters()
        if meta['kind'] == 'lora':
            if adapter_name is None:
                adapter_name = adapters[0] if len(adapters) == 1 else meta.get('adapter_name') or 'default'
            if adapter_name not in adapters:
                from peft import LoraConfig

                m.add_adapter_to_model(adapter_name, LoraConfig.from_pretrained(path))
            ckpt.load_lora(m.chunks, m.arch, path, adapter=adapter_name, tp=m.layout.tp, tp_rank=m.ranks['tp'])
        else:
            if adapters:
                raise InvalidInputError(
                    f'{path!r} holds full model weights but this model trains adapters '
                    f'{adapters}; load it into a model without adapters.'
                )
            build.load_hf_weights(
                m.chunks,
                m.arch,
                build.HFTensorReader(path),
                tp=m.layout.tp,
                tp_rank=m.ranks['tp'],
                expert_offset=m.expert_offset(),
            )
        unit = m.unit_for(adapter_name)
        state = unit.state
        if state.megatron_optimizer is not None:
            state.megatron_optimizer.reload_model_params()  # fp32 master copies follow the loaded weights
        if not load_optimizer:
            return None
        unit.wrap()
        saved = load_training_state(path)
        state.load_state_dict(saved['train_state'], load_optimizer_state=lambda optimizer, value: None)
        ckpt.load_optimizer(state, path)
        return restore_run_state(saved, dataloader)

    # ---- weight export -----------------------------------------------------------------------------------------
    def trains_base(self) -> bool:
        m = self.model
        return not m.list_adapters()

    def is_export_rank(self) -> bool:
        return dist.get_rank() == 0

    def weight_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        m = self.model
        a = m.arch
        dtype = str(m.dtype).removeprefix('torch.')
        shapes = {
            'model.embed_tokens.weight': (a.vocab_size, a.hidden_size),
            'model.norm.weight': (a.hidden_size,),
            'lm_head.weight': (a.vocab_size, a.hidden_size),
        }  # tied: the embedding, as in export_base
        for i in range(a.num_layers):
            p = f'model.layers.{i}.'
            shapes[p + 'input_layernorm.weight'] = shapes[p + 'post_attention_layernorm.weight'] = (a.hidden_size,)
            for proj in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
                shapes[f'{p}self_attn.{proj}.weight'] = part_rows(a, proj)
                if a.qkv_bias and proj != 'o_proj':
                    shapes[f'{p}self_attn.{proj}.bias'] = (part_rows(a, proj)[0],)
            if a.qk_norm:
                shapes[p + 'self_attn.q_norm.weight'] = shapes[p + 'self_attn.k_norm.weight'] = (a.head_dim,)
            if a.is_moe:
                shapes[p + 'mlp.gate.weight'] = (a.num_experts, a.hidden_size)
                for e in range(a.num_experts):
                    for proj, shape in (
                        ('gate_proj', (a.moe_ffn_hidden_size, a.hidden_size)),
                        ('up_proj', (a.moe_ffn_hidden_size, a.hidden_size)),
                        ('down_proj', (a.hidden_size, a.moe_ffn_hidden_size)),
                    ):
                        shapes[f'{p}mlp.experts.{e}.{proj}.weight'] = shape
            else:
                for proj in ('gate_proj', 'up_proj', 'down_proj'):
                    shapes[f'{p}mlp.{proj}.weight'] = part_rows(a, proj)
        return {name: (dtype, tuple(shape)) for name, shape in shapes.items()}

    def export_base(self, *, bucket_bytes: int = 256 << 20) -> Iterator[Bucket]:
        m = self.model
        weights = export.hf_base_weights(m.chunks, m.arch, m.expert_offset())
        yield from bucketed(weights, bucket_bytes)

    def export_adapter(self, name: str, *, bucket_bytes: int = 256 << 20) -> tuple[dict[str, Any], Iterator[Bucket]]:
        m = self.model
        if name not in m.list_adapters():
            adapters = m.list_adapters() or 'none'
            raise InvalidInputError(f'The model has no LoRA adapter {name!r}; adapters: {adapters}.')
        return self.adapter_config_json(name), bucketed(export.peft_weights(m.chunks, m.arch, name), bucket_bytes)

    def adapter_config_json(self, adapter: str) -> dict[str, Any]:
        m = self.model
        return ckpt.peft_config_dict(m.units[adapter].lora_config, m.model_id)
