"""`CheckpointEngineManager`: decides what a weight sync moves from a training model to a sampler, and applies it.

    # one process (the sampler may share the model's base weights)
    CheckpointEngineManager(model=model, sampler=sampler).sync_weights()

    # model and sampler in two device groups of the ray runtime: the same one-line form (the runtime's weight
    # sync broadcasts from every model rank to every sampler rank; `Runtime.weight_sync`)
    CheckpointEngineManager(model=model_proxy, sampler=sampler_proxy).sync_weights()

    # across processes: the same call on every side, with a cross-process engine
    CheckpointEngineManager(model=model, engine=BroadcastCheckpointEngine(...)).sync_weights()      # every model rank
    CheckpointEngineManager(sampler=sampler, engine=BroadcastCheckpointEngine(...)).sync_weights()  # receiver(s)

It plans only through the backend seam (docs/architecture.md §5): the model's `list_adapters`, `trains_base`,
`is_export_rank`, `export_base` and `export_adapter`, and the sampler's `shares_weights_with`; it applies through
the sampler's `begin_weight_update`, `load_weights` (one call per bucket), `add_adapter` and `end_weight_update`.
Every rank of a sharded model runs the same sync (exports gather collectively); only the export rank sends.

What moves (model side):
- `merge_and_sync=True`: base weights with the LoRA adapter merged in (`merge_peft`; the model is unchanged), as
  full weights. The sampler must own its base (merging into a shared base would change the training weights).
- LoRA training: the adapter's tensors (+ its LoRA config). The frozen base is sent once, on the first sync of
  this manager -- unless the sampler shares the base in this process, in which case it never moves; and when
  the sampler even shares the adapter (same module), nothing moves at all.
- full-parameter training: every base weight, every time (nothing when the sampler shares the module).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.registry import resolve
from twinkle_core.runtime.context import current_runtime
from twinkle_core.weight_sync.base import ADAPTER, BASE, CheckpointEngine, LabelledBucket, WeightUpdate
from twinkle_core.weight_sync.in_process import InProcessCheckpointEngine
from twinkle_core.weight_sync.weights import merge_peft

EXPORT_METHODS = ('list_adapters', 'trains_base', 'is_export_rank', 'export_base', 'export_adapter')


@dataclass(frozen=True)
class SyncReport:
    """What one `sync_weights` did. `moved`: False when the sampler already reads the very same tensors.
    `lora_only`: no base weights moved. On a model rank that is not the export rank the counts are 0."""

    moved: bool
    num_tensors: int = 0
    num_bytes: int = 0
    lora_only: bool = False
    merged: bool = False
    adapter_name: str | None = None


class CheckpointEngineManager:
    """`model`: anything with the export methods of `twinkle_core.model.Model` (a twinkle model, or a raw torch
    module wrapped as `twinkle_transformers.export.ModuleWeights(module)`). `adapter_name`: the model's adapter
    to sync (default: its only adapter, if it has exactly one); `sampler_adapter_name`: the name it gets in the
    sampler (default: the same). `engine`: a `CheckpointEngine`, a registered name (kind `checkpoint_engine`), or
    None for in-process when both sides are given. `bucket_bytes`: export bucket size."""

    def __init__(
        self,
        model: Any = None,
        sampler: Any = None,
        *,
        engine: CheckpointEngine | str | None = None,
        adapter_name: str | None = None,
        sampler_adapter_name: str | None = None,
        bucket_bytes: int = 256 << 20,
    ) -> None:
        if model is None and sampler is None:
            raise InvalidInputError('CheckpointEngineManager needs model=, sampler=, or both.')
        self._hosted: Any = None  # the runtime's sync, when model and sampler live in two of its device groups
        if engine is None and model is not None and sampler is not None:
            runtime = current_runtime()
            self._hosted = (
                runtime.weight_sync(
                    model,
                    sampler,
                    adapter_name=adapter_name,
                    sampler_adapter_name=sampler_adapter_name,
                    bucket_bytes=bucket_bytes,
                )
                if runtime is not None
                else None
            )
        if model is not None and self._hosted is None:
            missing = [m for m in EXPORT_METHODS if not callable(getattr(model, m, None))]
            if missing:
                raise InvalidInputError(
                    f'{type(model).__name__} cannot export weights (no {", ".join(missing)}); pass a twinkle model, '
                    'or wrap a torch module: twinkle_transformers.export.ModuleWeights(module).'
                )
        if engine is None:
            if model is None or sampler is None:
                raise InvalidInputError('Syncing across processes needs engine= (e.g. BroadcastCheckpointEngine).')
            self.engine: CheckpointEngine = InProcessCheckpointEngine()
        elif isinstance(engine, str):
            self.engine = resolve('checkpoint_engine', engine)
        else:
            self.engine = engine
        self.model, self.sampler = model, sampler
        self.adapter_name, self.sampler_adapter_name = adapter_name, sampler_adapter_name
        self.bucket_bytes = bucket_bytes
        self._sampler_has_pristine_base = False  # True once our base weights reached the sampler unmerged

    def sync_weights(self, merge_and_sync: bool = False) -> SyncReport:
        """Move the model's current weights into the sampler (see the module docstring for what moves)."""
        if self._hosted is not None:
            return SyncReport(**self._hosted.sync_weights(merge_and_sync=merge_and_sync))
        if self.model is None:  # receiving side of a cross-process sync
            return self._apply(self.engine.receive())
        plan = self._plan(merge_and_sync)
        if plan is None:
            return SyncReport(moved=False, adapter_name=self._adapter())
        metadata, buckets = plan
        if not self.model.is_export_rank():
            for _ in buckets:  # drive the collective gathers; only the export rank keeps tensors
                pass
            return SyncReport(moved=True, merged=merge_and_sync, adapter_name=metadata.get('adapter_name'))
        counter = _Counter(buckets)
        self.engine.send(counter, metadata=metadata)
        report = SyncReport(
            moved=True,
            num_tensors=counter.tensors,
            num_bytes=counter.bytes,
            lora_only=not counter.labels & {BASE},
            merged=merge_and_sync,
            adapter_name=metadata.get('adapter_name'),
        )
        if self.sampler is not None:
            self._apply(self.engine.receive())
        return report

    def close(self) -> None:
        """Release what the manager set up itself (the runtime's side process group between two device groups);
        an engine passed in stays the caller's to close."""
        if self._hosted is not None:
            self._hosted.close()

    # ---- model side ----------------------------------------------------------------------------------------
    def _adapter(self) -> str | None:
        return synced_adapter(self.model, self.adapter_name)

    def _plan(self, merge: bool) -> tuple[dict[str, Any], Iterator[LabelledBucket]] | None:
        sharing = self._sharing()
        adapter = self._adapter()
        base = lambda: self.model.export_base(bucket_bytes=self.bucket_bytes)  # noqa: E731 - lazy: collective
        if merge:
            if sharing != 'none':
                raise InvalidInputError(
                    'merge_and_sync=True needs a sampler with its own copy of the base weights; '
                    'this sampler shares them with the model (build it from model_id=).'
                )
            self._sampler_has_pristine_base = False
            buckets: Iterable[list[tuple[str, Any]]] = base()
            if adapter is not None:
                config, lora = self.model.export_adapter(adapter, bucket_bytes=self.bucket_bytes)
                tensors = {n: t for bucket in lora for n, t in bucket}  # small; gathered on every rank first
                if self.model.is_export_rank():
                    buckets = merge_peft(buckets, config, tensors)
            return {'merged': True}, _labelled(BASE, buckets)
        if adapter is None:  # full-parameter training
            if sharing != 'none':
                return None
            self._sampler_has_pristine_base = True
            return {}, _labelled(BASE, base())
        target = self.sampler_adapter_name or adapter
        if sharing == 'all' and target == adapter:
            return None  # the sampler runs this very adapter's tensors already
        config, lora = self.model.export_adapter(adapter, bucket_bytes=self.bucket_bytes)
        metadata = {'adapter_name': target, 'lora_config': config}
        if sharing != 'none' or self._sampler_has_pristine_base:
            return metadata, _labelled(ADAPTER, lora)
        self._sampler_has_pristine_base = True
        return metadata, itertools.chain(_labelled(BASE, base()), _labelled(ADAPTER, lora))

    def _sharing(self) -> str:
        return weight_sharing(self.sampler, self.model)

    # ---- sampler side --------------------------------------------------------------------------------------
    def _apply(self, update: WeightUpdate) -> SyncReport:
        if self.sampler is None:
            raise TwinkleError('This manager has no sampler to apply received weights to.')
        adapter = update.metadata.get('adapter_name')
        lora: dict[str, Any] = {}
        counter = _Counter(update.buckets)
        sampler = self.sampler
        sampler.begin_weight_update()
        try:
            for label, bucket in counter:
                if label == BASE:
                    sampler.load_weights(bucket)
                elif label == ADAPTER:
                    lora.update(bucket)
                else:
                    raise TwinkleError(f'Received a bucket labelled {label!r}; sender and receiver disagree.')
            if lora:
                if adapter is None:
                    raise TwinkleError('Received LoRA tensors without an adapter name in the update metadata.')
                sampler.add_adapter(adapter, update.metadata.get('lora_config'), lora)
        finally:
            sampler.end_weight_update()  # resumes with the prefix cache reset, also after a failed update
        return SyncReport(
            moved=True,
            num_tensors=counter.tensors,
            num_bytes=counter.bytes,
            lora_only=not counter.labels & {BASE},
            merged=bool(update.metadata.get('merged')),
            adapter_name=adapter,
        )


def synced_adapter(model: Any, adapter_name: str | None = None) -> str | None:
    """The adapter of `model` a sync moves: `adapter_name` (checked to exist), else the model's only adapter, or
    None when it has none (full-parameter training); several adapters and no name is an error."""
    adapters = model.list_adapters()
    if adapter_name is not None:
        if adapter_name not in adapters:
            raise InvalidInputError(f'The model has no adapter {adapter_name!r}; adapters: {adapters or "none"}.')
        return adapter_name
    if len(adapters) > 1:
        raise InvalidInputError(f'The model has several adapters {adapters}; pass adapter_name= to the manager.')
    return adapters[0] if adapters else None


class _Counter:
    """Passes labelled buckets through, counting tensors, bytes and labels seen."""

    def __init__(self, buckets: Iterable[LabelledBucket]) -> None:
        self._buckets = buckets
        self.tensors = self.bytes = 0
        self.labels: set[str] = set()

    def __iter__(self) -> Iterator[LabelledBucket]:
        for label, bucket in self._buckets:
            self.labels.add(label)
            self.tensors += len(bucket)
            self.bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            yield label, bucket


def weight_sharing(sampler: Any, model: Any) -> str:
    """What `sampler` shares of `model`'s weights: 'all' (it runs the model's very module), 'base' (the base
    weights) or 'none' -- also for no sampler (cross-process) and a remote proxy, whose weights always move."""
    from twinkle_core.sampler.base import Sampler

    if isinstance(sampler, Sampler):
        return sampler.shares_weights_with(model)
    return 'none'


def _labelled(label: str, buckets: Iterable[list[tuple[str, Any]]]) -> Iterator[LabelledBucket]:
    return ((label, bucket) for bucket in buckets)
