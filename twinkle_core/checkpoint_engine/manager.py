"""`CheckpointEngineManager`: decides what a weight sync moves from a training model to a sampler, and applies it.

    # one process (the sampler may share the model's base weights)
    CheckpointEngineManager(model=model, sampler=sampler).sync_weights()

    # across processes: the same call on both sides, with a cross-process engine
    CheckpointEngineManager(model=model, engine=BroadcastCheckpointEngine(...)).sync_weights()      # sender
    CheckpointEngineManager(sampler=sampler, engine=BroadcastCheckpointEngine(...)).sync_weights()  # receiver(s)

What moves (model side):
- `merge_and_sync=True`: base weights with the LoRA adapter merged in (a copy; the model is unchanged), as full
  weights. The sampler must own its base (merging into a shared base would change the training weights).
- LoRA training: the adapter's tensors (+ its LoRA config). The frozen base is sent once, on the first sync of
  this manager -- unless the sampler shares the base in this process, in which case it never moves; and when
  the sampler even shares the adapter (same module), nothing moves at all.
- full-parameter training: every base weight, every time (nothing when the sampler shares the module).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle_core.checkpoint_engine.base import CheckpointEngine, WeightUpdate
from twinkle_core.checkpoint_engine import weights as W
from twinkle_core.errors import InvalidInputError, TwinkleError


@dataclass(frozen=True)
class SyncReport:
    """What one `sync_weights` did. `moved`: False when the sampler already reads the very same tensors."""
    moved: bool
    num_tensors: int = 0
    num_bytes: int = 0
    lora_only: bool = False
    merged: bool = False
    adapter_name: str | None = None


class CheckpointEngineManager:
    """`adapter_name`: the model's adapter to sync (default: its only adapter, if it has exactly one);
    `sampler_adapter_name`: the name it gets in the sampler (default: the same). `engine`: a `CheckpointEngine`,
    a registered name (kind `checkpoint_engine`), or None for in-process when both sides are given."""

    def __init__(self, model: Any = None, sampler: Any = None, *, engine: CheckpointEngine | str | None = None,
                 adapter_name: str | None = None, sampler_adapter_name: str | None = None) -> None:
        if model is None and sampler is None:
            raise InvalidInputError('CheckpointEngineManager needs model=, sampler=, or both.')
        if engine is None:
            if model is None or sampler is None:
                raise InvalidInputError('Syncing across processes needs engine= (e.g. BroadcastCheckpointEngine).')
            from twinkle_core.checkpoint_engine.in_process import InProcessCheckpointEngine
            engine = InProcessCheckpointEngine()
        elif isinstance(engine, str):
            from twinkle_core.registry import resolve
            engine = resolve('checkpoint_engine', engine)
        self.model, self.sampler, self.engine = model, sampler, engine
        self.adapter_name, self.sampler_adapter_name = adapter_name, sampler_adapter_name
        self._sampler_has_pristine_base = False  # True once our base weights reached the sampler unmerged

    def sync_weights(self, merge_and_sync: bool = False) -> SyncReport:
        """Move the model's current weights into the sampler (see the module docstring for what moves)."""
        if self.model is None:  # receiving side of a cross-process sync
            return self._apply(self.engine.receive())
        plan = self._plan(merge_and_sync)
        if plan is None:
            return SyncReport(moved=False, adapter_name=self._adapter())
        tensors, lora_only, metadata = plan
        self.engine.send(tensors, lora_only=lora_only, metadata=metadata)
        report = SyncReport(moved=True, num_tensors=len(tensors), lora_only=lora_only, merged=merge_and_sync,
                            num_bytes=sum(t.numel() * t.element_size() for _, t in tensors),
                            adapter_name=metadata.get('adapter_name'))
        if self.sampler is not None:
            self._apply(self.engine.receive())
        return report

    # ---- model side ----------------------------------------------------------------------------------------
    def _adapter(self) -> str | None:
        module = W.module_of(self.model)
        adapters = W.lora_adapters(module)
        if self.adapter_name is not None:
            if self.adapter_name not in adapters:
                raise InvalidInputError(f'The model has no adapter {self.adapter_name!r}; adapters: '
                                        f'{adapters or "none"}.')
            return self.adapter_name
        if len(adapters) > 1:
            raise InvalidInputError(f'The model has several adapters {adapters}; pass adapter_name= to the manager.')
        return adapters[0] if adapters else None

    def _plan(self, merge: bool) -> tuple[list[tuple[str, Any]], bool, dict[str, Any]] | None:
        module = W.module_of(self.model)
        sampler_module = self._sampler_module()
        shared = sampler_module is not None and W.shares_base(module, sampler_module)
        adapter = self._adapter()
        if merge:
            if shared:
                raise InvalidInputError('merge_and_sync=True needs a sampler with its own copy of the base weights; '
                                        'this sampler shares them with the model (build it from model_id=).')
            self._sampler_has_pristine_base = False
            tensors = list(W.merged_tensors(module, adapter)) if adapter else list(W.base_tensors(module).items())
            return tensors, False, {'merged': True}
        if adapter is None:  # full-parameter training
            if shared:
                return None
            self._sampler_has_pristine_base = True
            return [(n, t.detach()) for n, t in W.base_tensors(module).items()], False, {}
        target = self.sampler_adapter_name or adapter
        if shared and sampler_module is module and target == adapter:
            return None  # the sampler runs this very adapter's tensors already
        lora, config = W.adapter_export(module, adapter)
        metadata = {'adapter_name': target, 'lora_config': config}
        if shared or self._sampler_has_pristine_base:
            return list(lora.items()), True, metadata
        self._sampler_has_pristine_base = True
        base = [(n, t.detach()) for n, t in W.base_tensors(module).items()]
        return base + list(lora.items()), False, metadata

    def _sampler_module(self) -> Any:
        if self.sampler is None:
            return None
        try:
            return W.module_of(self.sampler)
        except InvalidInputError:
            return None  # a remote sampler: weights always move

    # ---- sampler side --------------------------------------------------------------------------------------
    def _apply(self, update: WeightUpdate) -> SyncReport:
        if self.sampler is None:
            raise TwinkleError('This manager has no sampler to apply received weights to.')
        adapter = update.metadata.get('adapter_name')
        lora: dict[str, Any] = {}
        count = nbytes = 0

        def base_only():  # streams base tensors into the sampler, setting LoRA tensors aside
            nonlocal count, nbytes
            for name, tensor in update:
                count += 1
                nbytes += tensor.numel() * tensor.element_size()
                if W.is_lora_name(name):
                    lora[name] = tensor
                else:
                    yield name, tensor

        sampler = self.sampler
        sampler.begin_weight_update()
        try:
            if update.lora_only:
                for _ in base_only():
                    raise TwinkleError('A LoRA-only update carried base weights; sender and receiver disagree.')
            else:
                sampler.load_weights(base_only())
            if lora:
                if adapter is None:
                    raise TwinkleError('Received LoRA tensors without an adapter name in the update metadata.')
                sampler.add_adapter(adapter, update.metadata.get('lora_config'), lora)
        finally:
            sampler.end_weight_update()  # resumes with the prefix cache reset, also after a failed update
        return SyncReport(moved=True, num_tensors=count, num_bytes=nbytes, lora_only=update.lora_only,
                          merged=bool(update.metadata.get('merged')), adapter_name=adapter)
