"""Multi-tenant LoRA: many adapters on one frozen base model, mixed in one forward/backward (docs/architecture.md §4).

Inference / sampler API (no training state needed)::

    from twinkle_transformers.multi_lora import MultiLoraManager, adapter_indices

    manager = MultiLoraManager.attach(hf_model)              # freezes the base; one manager per model
    manager.add_adapter('alice', {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear'})
    manager.add_adapter('bob', state_dict=peft_state_dict, config=lora_config)   # weights in peft key format
    manager.load_adapter('carol', '/ckpt/carol')             # a PEFT adapter directory
    index = manager.index_tensor(['alice', 'carol', None])   # one per row; None = base model only
    with adapter_indices(hf_model, index):                   # same as `with manager.adapter_indices(index):`
        out = hf_model.generate(...)                         # per-row [B] works for every decode step
    with manager.use_adapter('bob'):                         # every token -> one adapter (fast path)
        ...
    manager.remove_adapter('alice')                          # parameters freed
    find_manager(hf_model)                                   # the model's manager, or None (creates nothing)

`index` may also be per token, shape [B, T] (padding-free packed batches: [1, T]); -1 marks base-only tokens.
Every `nn.Linear` an adapter targets becomes a `MultiLoraLinear` (grouped per-adapter matmuls on token
segments); adapters may have different ranks, alphas, dropouts and targets. Slots are never reused.

Training: `MultiLoraTransformersModel` (kind `model`) adds per-adapter optimizer, scheduler, loss, template,
processor, gradient accumulation and metrics, and mixes tenants in shared passes:
``model.forward_backward(inputs={'alice': rows, 'bob': rows})``. `PassPlanner` decides, per step and from measured
cost, whether they share one pass, run in groups or one by one (``pass_strategy='auto'|'mixed'|'one_by_one'``).
"""

from twinkle_transformers.multi_lora.layer import LoraWeights, MultiLoraLinear
from twinkle_transformers.multi_lora.manager import MultiLoraManager, adapter_indices, attached_manager, find_manager
from twinkle_transformers.multi_lora.routing import BASE_ONLY, AdapterRouter

__all__ = [
    'BASE_ONLY',
    'AdapterRouter',
    'LoraWeights',
    'MixedStepError',
    'MultiLoraLinear',
    'MultiLoraManager',
    'MultiLoraTransformersModel',
    'PassPlanner',
    'TenantStepError',
    'adapter_indices',
    'attached_manager',
    'find_manager',
]

_LAZY = {
    'MultiLoraTransformersModel': 'twinkle_transformers.multi_lora.model',
    'MixedStepError': 'twinkle_core.model.step_errors',
    'PassPlanner': 'twinkle_transformers.multi_lora.pass_planner',
    'TenantStepError': 'twinkle_core.model.step_errors',
}


def __getattr__(name: str):  # the training engine (and its registry imports) load only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
