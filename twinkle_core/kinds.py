"""The component kinds: their names, the interface of each, and which kinds load their hub repos their own way.

A leaf module (it imports only `twinkle_core.errors`), read by the registry, the hub loader and the hub manifest.
Interfaces and loaders are named by ``"module:attr"`` targets and imported only when needed, never here: the
layers below the components (registry, index, hub) reach a component only through such a target -- an entry point,
an interface or a hub loader -- never by importing it (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import difflib

from twinkle_core.errors import TwinkleError

KINDS: tuple[str, ...] = (
    'model',
    'sampler',
    'loss',
    'advantage',
    'reward',
    'metric',
    'template',
    'preprocessor',
    'processor',
    'patch',
    'kernel',
    'runtime',
    'checkpoint_engine',
    'optimizer',
    'lr_scheduler',
    'dataset_source',
    'env',
    'tool',
    'task',
)

# The interface of each kind ("module:attr"), imported only when a plain function must be wrapped.
KIND_INTERFACES: dict[str, str] = {
    'model': 'twinkle_core.model.base:Model',
    'sampler': 'twinkle_core.sampler.base:Sampler',
    'loss': 'twinkle_core.loss.base:Loss',
    'advantage': 'twinkle_core.advantage.base:Advantage',
    'reward': 'twinkle_core.reward.base:Reward',
    'metric': 'twinkle_core.metric.base:Metric',
    'template': 'twinkle_core.template.base:Template',
    'preprocessor': 'twinkle_core.preprocessor.base:Preprocessor',
    'processor': 'twinkle_core.processor.base:InputProcessor',
    'patch': 'twinkle_core.patch.base:Patch',
    'kernel': 'twinkle_core.kernel.base:Kernel',
    'runtime': 'twinkle_core.runtime.base:Runtime',
    'checkpoint_engine': 'twinkle_core.weight_sync.base:CheckpointEngine',
    'env': 'twinkle_core.env.base:Env',
    'tool': 'twinkle_core.tool.decorator:FunctionTool',  # Tool's implementation for typed functions
    'task': 'twinkle_core.eval.task:EvalTask',
}

# Kinds whose hub repos are not imported module by module (`twinkle_core.hub.importer`) but by their own loader
# ("module:attr"), called as ``loader(ref, folder, sha256)`` once the folder is downloaded and verified: a kernel
# repo is in the Hugging Face ``kernels`` layout, imported by that library.
KIND_HUB_LOADERS: dict[str, str] = {
    'kernel': 'twinkle_core.kernel.hub:load_layer_kernel',
}


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=3)
        hint = f' Did you mean {", ".join(repr(c) for c in close)}?' if close else ''
        raise TwinkleError(f'Unknown component kind {kind!r}.{hint} Kinds: {", ".join(KINDS)}.')
